// The structure of a KServe v2 ModelInferRequest, checked against the model
// it names before any tensor is decoded or any output is built.
//
// Triton refuses each of these, and so do we, with INVALID_ARGUMENT naming
// the tensor and the model:
// - more inputs than the model takes, an input it does not take, or the
//   same input twice (otherwise the later copy would silently win);
// - raw_input_contents that are not one entry per input, or an input given
//   both raw and typed contents (otherwise raw would silently win);
// - an output the model does not have, or the same output requested twice
//   (otherwise each copy would be built: 500 copies of a 4 MiB attention
//   map from a 23 KB request).
// After it passes, every input and requested output names a distinct tensor
// of the model, so a response holds each output at most once and its size
// is bounded by the result size the core checks before computing
// (CallRunner::CheckResultFits).
//
// Pure function of its arguments; thread-safe.
#ifndef ATTNSERVE_SERVER_KSERVE_REQUEST_H_
#define ATTNSERVE_SERVER_KSERVE_REQUEST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inference/grpc_service.pb.h"

namespace attnserve {

// The tensor names of a served model, as the check needs them.
struct ModelTensorNames {
  std::string model;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
};

// OK, or INVALID_ARGUMENT naming the first problem found (see above).
absl::Status CheckInferRequestStructure(
    const inference::ModelInferRequest& request,
    const ModelTensorNames& model);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_REQUEST_H_
