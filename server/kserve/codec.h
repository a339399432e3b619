// The KServe v2 tensor codec: a ModelInferRequest's inputs into a model's
// inputs (server/models/model_kind.h), and a result's tensors into a
// ModelInferResponse. The float decoding is every front end's
// (server/models/input_decoding.h): the same finiteness and element count
// checks, the same element budget.
//
// Inputs come as raw_input_contents or typed contents: FP32, and INT32 or
// INT64 for valid lengths. Outputs always go back as raw_output_contents,
// one per output, in the order asked for.
//
// Thread-compatible: functions over the caller's objects; none blocks.
#ifndef ATTNSERVE_SERVER_KSERVE_CODEC_H_
#define ATTNSERVE_SERVER_KSERVE_CODEC_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attn/tensor.h"
#include "inference/grpc_service.pb.h"
#include "server/models/model_kind.h"
#include "server/models/input_decoding.h"
#include "server/execution/element_budget.h"

namespace attnserve {

// Decodes every input of `request` into `out`, counting elements in
// `budget`. `request` must have passed CheckInferRequestStructure
// (server/kserve/request.h) against `model`. INVALID_ARGUMENT naming the
// input (wrong datatype, shape or count, a scalar valid_lens, a required
// input missing); RESOURCE_EXHAUSTED over the budget.
absl::Status DecodeInputs(const inference::ModelInferRequest& request,
                          const ModelSignature& model, ElementBudget* budget,
                          ModelInputs* out);

// The outputs to return, in order: those requested (checked by
// CheckInferRequestStructure: the model's, each once), else the model's
// defaults.
std::vector<std::string> RequestedOutputs(
    const inference::ModelInferRequest& request, const ModelSignature& model);

// Fills `response`: the request's model name and id, the served version,
// and the tensors `names` in that order, each found in `tensors` (which
// must hold every one of them) and sent as FP32 raw_output_contents.
void Respond(const inference::ModelInferRequest& request,
             const std::vector<std::string>& names,
             const std::map<std::string, const attn::Tensor*>& tensors,
             inference::ModelInferResponse* response);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_CODEC_H_
