#include "server/models/input_decoding.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "raw tensors are little-endian float32 and are read in place");

namespace attnserve {
namespace {

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

}  // namespace attnserve
