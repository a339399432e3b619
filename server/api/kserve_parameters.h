// The KServe v2 request parameters (ModelInferRequest.parameters) this
// service reads: Triton's scheduling parameters, which apply to every model,
// and the Nadaraya-Watson models' kernel and bandwidth. A parameter of the
// wrong type or value is INVALID_ARGUMENT naming it; parameters not read
// here are ignored, as Triton does.
//
// Pure functions of their arguments; thread-safe; none blocks.
#ifndef ATTNSERVE_SERVER_API_KSERVE_PARAMETERS_H_
#define ATTNSERVE_SERVER_API_KSERVE_PARAMETERS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "inference/grpc_service.pb.h"
#include "server/core/call_runner.h"

namespace attnserve {

// Triton's "priority" (uint64; 1 the highest, 0 none) and "timeout"
// (microseconds), into the call's context: each an int64_param or
// uint64_param, non-negative.
absl::Status ApplyPriorityAndTimeout(const inference::ModelInferRequest& request,
                                     CallContext* context);

// "kernel" (string_param): gaussian (the default), boxcar, constant or
// epanechnikov.
absl::StatusOr<attn::RegressionKernel> KernelParameter(
    const inference::ModelInferRequest& request);

// "bandwidth" (double_param or int64_param); 1 when not given.
absl::StatusOr<float> BandwidthParameter(
    const inference::ModelInferRequest& request);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_KSERVE_PARAMETERS_H_
