#include "server/models/model_kind.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

attn::TensorView ModelInputs::Float(const std::string& name) const {
  auto it = floats.find(name);
  return it == floats.end() ? attn::TensorView{} : it->second;
}

attn::LengthsView ModelInputs::Lengths(const std::string& name) const {
  auto it = lengths.find(name);
  return it == lengths.end() ? attn::LengthsView{} : it->second;
}

std::map<std::string, const attn::Tensor*> ModelKind::ResultTensors(
    const attn::OpResult& result) const {
  std::map<std::string, const attn::Tensor*> tensors{
      {result_output, &result.output}};
  if (!weights_output.empty()) tensors[weights_output] = &result.weights;
  return tensors;
}

absl::Status ModelKind::WithInputNames(absl::Status status) const {
  if (status.ok()) return status;
  for (const auto& [prefix, input] : argument_inputs) {
    if (absl::StartsWith(status.message(), prefix)) {
      return absl::Status(
          status.code(),
          absl::StrCat("input '", input, "'",
                       status.message().substr(prefix.size() - 1)));
    }
  }
  return status;
}

}  // namespace attnserve
