#include "attn/tensor.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attn {

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

absl::StatusOr<int64_t> CheckedNumElements(absl::string_view name,
                                           const Shape& shape) {
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": dimension ", i, " of shape ",
                       ShapeToString(shape), " is ", shape[i],
                       "; every dimension must be at least 1"));
    }
    // count <= kMaxTensorElements < 2^31 and shape[i] is checked against the
    // quotient first, so the product never overflows.
    if (shape[i] > kMaxTensorElements / count) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": shape ", ShapeToString(shape), " has more than ",
          kMaxTensorElements, " elements (the per-tensor limit)"));
    }
    count *= shape[i];
  }
  return count;
}

int64_t TensorView::num_elements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

Tensor Tensor::Uninitialized(Shape shape) {
  Tensor tensor;
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  tensor.shape = std::move(shape);
  tensor.data.resize(static_cast<size_t>(count));
  return tensor;
}

Tensor Tensor::Zeros(Shape shape) {
  Tensor tensor;
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  tensor.shape = std::move(shape);
  tensor.data.assign(static_cast<size_t>(count), 0.0f);
  return tensor;
}

}  // namespace attn
