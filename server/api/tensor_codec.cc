#include "server/api/tensor_codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "raw tensors are little-endian float32 and are read in place");

namespace attnserve {
namespace {

attn::Shape ShapeOf(const google::protobuf::RepeatedField<int64_t>& dims) {
  return attn::Shape(dims.begin(), dims.end());
}

absl::Status CheckFinite(absl::string_view field, const float* data,
                         int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": element ", i, " is ", data[i],
                       "; every input element must be finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<attn::TensorView> DecodeFloatValues(
    absl::string_view field, attn::Shape shape, const float* values,
    int64_t count, ElementBudget* budget) {
  attn::TensorView view;
  view.shape = std::move(shape);
  ASSIGN_OR_RETURN(const int64_t expected,
                   attn::CheckedNumElements(field, view.shape));
  RETURN_IF_ERROR(budget->Take(field, expected));
  if (count != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", attn::ShapeToString(view.shape), " needs ",
        expected, " values, got ", count));
  }
  view.data = values;
  RETURN_IF_ERROR(CheckFinite(field, view.data, expected));
  return view;
}

absl::StatusOr<attn::TensorView> DecodeRawFloats(absl::string_view field,
                                                 attn::Shape shape,
                                                 const std::string& raw,
                                                 ElementBudget* budget,
                                                 DecodeStorage* storage) {
  attn::TensorView view;
  view.shape = std::move(shape);
  ASSIGN_OR_RETURN(const int64_t count,
                   attn::CheckedNumElements(field, view.shape));
  RETURN_IF_ERROR(budget->Take(field, count));
  if (static_cast<int64_t>(raw.size()) != 4 * count) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", attn::ShapeToString(view.shape), " needs ",
        4 * count, " raw bytes (little-endian float32), got ", raw.size()));
  }
  if (reinterpret_cast<uintptr_t>(raw.data()) % alignof(float) == 0) {
    view.data = reinterpret_cast<const float*>(raw.data());
  } else {
    attn::FloatBuffer& copy = storage->emplace_back(count);
    std::memcpy(copy.data(), raw.data(), raw.size());
    view.data = copy.data();
  }
  RETURN_IF_ERROR(CheckFinite(field, view.data, count));
  return view;
}

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
