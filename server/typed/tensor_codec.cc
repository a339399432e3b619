#include "server/typed/tensor_codec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attnserve {
namespace {

attn::Shape ShapeOf(const google::protobuf::RepeatedField<int64_t>& dims) {
  return attn::Shape(dims.begin(), dims.end());
}

}  // namespace

absl::StatusOr<attn::TensorView> DecodeTensor(
    absl::string_view field, const attention::v1::Tensor& tensor,
    ElementBudget* budget, DecodeStorage* storage) {
  attn::Shape shape = ShapeOf(tensor.shape());
  const bool has_values = !tensor.values().empty();
  const bool has_raw = !tensor.raw().empty();
  if (shape.empty() && !has_values && !has_raw) return attn::TensorView{};
  if (has_values && has_raw) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": set exactly one of values and raw, not both"));
  }
  if (has_raw) {
    return DecodeRawFloats(field, std::move(shape), tensor.raw(), budget,
                           storage);
  }
  if (!has_values) {
    // Checked first so that an empty tensor's error names its shape.
    RETURN_IF_ERROR(attn::CheckedNumElements(field, shape).status());
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", attn::ShapeToString(shape),
        " given without data (set values or raw)"));
  }
  return DecodeFloatValues(field, std::move(shape), tensor.values().data(),
                           tensor.values_size(), budget);
}

absl::StatusOr<attn::LengthsView> DecodeLengths(
    absl::string_view field, const attention::v1::Lengths& lengths) {
  attn::LengthsView view;
  view.shape = ShapeOf(lengths.shape());
  if (view.shape.empty()) {
    if (!lengths.values().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": values given without a shape; expected shape (B,) or "
                 "(B, Q)"));
    }
    return view;
  }
  ASSIGN_OR_RETURN(const int64_t count,
                   attn::CheckedNumElements(field, view.shape));
  if (lengths.values_size() != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", attn::ShapeToString(view.shape), " needs ", count,
        " values, got ", lengths.values_size()));
  }
  view.data = lengths.values().data();
  return view;
}

void EncodeTensor(const attn::Tensor& tensor,
                  attention::v1::TensorEncoding encoding,
                  attention::v1::Tensor* out) {
  out->mutable_shape()->Assign(tensor.shape.begin(), tensor.shape.end());
  if (encoding == attention::v1::TENSOR_ENCODING_RAW) {
    out->set_raw(reinterpret_cast<const char*>(tensor.data.data()),
                 tensor.data.size() * sizeof(float));
  } else {
    out->mutable_values()->Assign(tensor.data.begin(), tensor.data.end());
  }
}

}  // namespace attnserve
