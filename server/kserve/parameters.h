// The KServe v2 request parameters (ModelInferRequest.parameters): Triton's
// scheduling parameters, which apply to every model and are read here, and
// the rest, handed to the model's kind (the Nadaraya-Watson models' kernel
// and bandwidth: server/models/model_kinds.h). A parameter of the wrong type
// or value is INVALID_ARGUMENT naming it; parameters no one reads are
// ignored, as Triton does.
//
// Pure functions of their arguments; thread-safe; none blocks.
#ifndef ATTNSERVE_SERVER_KSERVE_PARAMETERS_H_
#define ATTNSERVE_SERVER_KSERVE_PARAMETERS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"
#include "server/execution/call_runner.h"
#include "server/models/model_kind.h"

namespace attnserve {

// Triton's "priority" (uint64; 1 the highest, 0 none) and "timeout"
// (microseconds), into the call's context: each an int64_param or
// uint64_param, non-negative.
absl::Status ApplyPriorityAndTimeout(const inference::ModelInferRequest& request,
                                     CallContext* context);

// The request's parameters as the models read them
// (server/models/model_kind.h): each InferParameter's value in its own type.
ModelParameters ModelParametersOf(const inference::ModelInferRequest& request);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_PARAMETERS_H_
