#include "server/kserve/request.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve {
namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool HasTypedContents(const inference::InferTensorContents& contents) {
  return contents.bool_contents_size() > 0 ||
         contents.int_contents_size() > 0 ||
         contents.int64_contents_size() > 0 ||
         contents.uint_contents_size() > 0 ||
         contents.uint64_contents_size() > 0 ||
         contents.fp32_contents_size() > 0 ||
         contents.fp64_contents_size() > 0 ||
         contents.bytes_contents_size() > 0;
}

}  // namespace

absl::Status CheckInferRequestStructure(
    const inference::ModelInferRequest& request,
    const ModelTensorNames& model) {
  const std::string takes = absl::StrJoin(model.inputs, ", ");
  if (request.inputs_size() > static_cast<int>(model.inputs.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: model '", model.model, "' takes at most ",
        model.inputs.size(), " inputs (", takes, "), got ",
        request.inputs_size()));
  }
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents: ", request.raw_input_contents_size(),
        " entries for ", request.inputs_size(),
        " inputs; give one per input, in order"));
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& input : request.inputs()) {
    const std::string field = absl::StrCat("input '", input.name(), "'");
    if (!Contains(model.inputs, input.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": model '", model.model,
                       "' has no such input (it takes ", takes, ")"));
    }
    if (!seen.insert(input.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": given twice for model '", model.model,
          "'; give each input once"));
    }
    if (raw && input.has_contents() && HasTypedContents(input.contents())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": has both raw_input_contents and typed contents for model '",
          model.model, "'; give one of them"));
    }
  }
  seen.clear();
  for (const auto& output : request.outputs()) {
    const std::string field = absl::StrCat("output '", output.name(), "'");
    if (!Contains(model.outputs, output.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": model '", model.model, "' has no such output (it has ",
          absl::StrJoin(model.outputs, ", "), ")"));
    }
    if (!seen.insert(output.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": requested twice for model '", model.model,
          "'; request each output once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve
