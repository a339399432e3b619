#include "server/kserve/parameters.h"

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

ModelParameters ModelParametersOf(const inference::ModelInferRequest& request) {
  ModelParameters parameters;
  for (const auto& [name, value] : request.parameters()) {
    ParameterValue& entry = parameters[name];
    switch (value.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        entry = value.bool_param();
        break;
      case inference::InferParameter::kInt64Param:
        entry = value.int64_param();
        break;
      case inference::InferParameter::kUint64Param:
        entry = value.uint64_param();
        break;
      case inference::InferParameter::kDoubleParam:
        entry = value.double_param();
        break;
      case inference::InferParameter::kStringParam:
        entry = value.string_param();
        break;
      default:  // no value
        break;
    }
  }
  return parameters;
}

}  // namespace attnserve
