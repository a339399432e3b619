// KServe's face of the model repository extension (Triton's): the index,
// load and unload requests of both KServe front ends decoded into the
// catalogue's calls (server/models/model_catalogue.h), and its index
// encoded back.
//
// Pure functions of their arguments; thread-compatible; none blocks.
#ifndef ATTNSERVE_SERVER_KSERVE_MODEL_CONTROL_H_
#define ATTNSERVE_SERVER_KSERVE_MODEL_CONTROL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "inference/grpc_service.pb.h"
#include "server/models/model_catalogue.h"

namespace attnserve {

// The names of a load or unload request's parameters.
std::vector<std::string> ParameterNames(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>&
        parameters);

// A load request of either KServe front end, `model_name` with its
// `parameters`, carried out on `catalogue`: who may load is checked first
// (ModelCatalogue::CheckLoadAllowed), then an upload the parameters carry is
// decoded (`config`, a string, and each `file:<path>`: bytes, or a string
// of them in base64 as the REST body has them; INVALID_ARGUMENT naming a
// parameter of the wrong type or not base64), then ModelCatalogue::Load
// and its statuses. Blocks on file I/O as Load does.
//
// An uploaded file's bytes are moved out of `parameters`, never copied: the
// upload costs the request it came in and nothing more (docs/deploy.md's
// memory bounds count on it).
absl::Status LoadModel(
    ModelCatalogue& catalogue, bool may_control_models,
    const std::string& model_name,
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>*
        parameters);

// The catalogue's index as a RepositoryIndexResponse, each model at the
// served version.
void EncodeIndex(const std::vector<ModelCatalogue::ModelState>& index,
                 inference::RepositoryIndexResponse* response);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_MODEL_CONTROL_H_
