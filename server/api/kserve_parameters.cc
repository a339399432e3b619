#include "server/api/kserve_parameters.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace attnserve {

absl::Status ApplyPriorityAndTimeout(const inference::ModelInferRequest& request,
                                     CallContext* context) {
  for (const char* name : {"priority", "timeout"}) {
    auto it = request.parameters().find(name);
    if (it == request.parameters().end()) continue;
    int64_t value = -1;
    switch (it->second.parameter_choice_case()) {
      case inference::InferParameter::kInt64Param:
        value = it->second.int64_param();
        break;
      case inference::InferParameter::kUint64Param:
        value = static_cast<int64_t>(
            std::min<uint64_t>(it->second.uint64_param(), uint64_t{1} << 62));
        break;
      default:  // any other type: refused below
        break;
    }
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name,
          "': must be a non-negative integer (int64_param or uint64_param)"));
    }
    if (std::string(name) == "priority") {
      context->priority = static_cast<uint64_t>(value);
    } else {
      ApplyTimeout(value, context);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<attn::RegressionKernel> KernelParameter(
    const inference::ModelInferRequest& request) {
  auto it = request.parameters().find("kernel");
  if (it == request.parameters().end()) return attn::RegressionKernel::kGaussian;
  const std::string& kernel = it->second.string_param();
  if (kernel == "gaussian") return attn::RegressionKernel::kGaussian;
  if (kernel == "boxcar") return attn::RegressionKernel::kBoxcar;
  if (kernel == "constant") return attn::RegressionKernel::kConstant;
  if (kernel == "epanechnikov") return attn::RegressionKernel::kEpanechnikov;
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter 'kernel': '", kernel,
      "' is not one of gaussian, boxcar, constant, epanechnikov"));
}

absl::StatusOr<float> BandwidthParameter(
    const inference::ModelInferRequest& request) {
  auto it = request.parameters().find("bandwidth");
  if (it == request.parameters().end()) return 1.0f;
  switch (it->second.parameter_choice_case()) {
    case inference::InferParameter::kDoubleParam:
      return static_cast<float>(it->second.double_param());
    case inference::InferParameter::kInt64Param:
      return static_cast<float>(it->second.int64_param());
    default:  // any other type is refused
      return absl::InvalidArgumentError(
          "parameter 'bandwidth': must be a number (double_param)");
  }
}

}  // namespace attnserve
