// Dense float32 tensors in row-major order, and the shape arithmetic every
// operation validates its arguments with.
//
// TensorView and LengthsView do not own their data: the caller keeps it alive
// for the duration of the call that receives the view. Tensor owns its data.
// None of these types synchronise: share them read-only or not at all.
#ifndef ATTN_TENSOR_H_
#define ATTN_TENSOR_H_

#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attn {

using Shape = std::vector<int64_t>;

// The largest element count any single tensor may have (2^31 - 1): every
// index then fits a signed 32-bit BLAS dimension and byte counts fit int64.
inline constexpr int64_t kMaxTensorElements = (int64_t{1} << 31) - 1;

// "(2, 10, 4)"; "()" for a scalar.
std::string ShapeToString(const Shape& shape);

// The number of elements of `shape`. INVALID_ARGUMENT naming `name` when a
// dimension is not positive (empty tensors are rejected: no operation has a
// meaningful empty result) or the product exceeds kMaxTensorElements (which
// includes every product that would overflow int64).
absl::StatusOr<int64_t> CheckedNumElements(absl::string_view name,
                                           const Shape& shape);

struct TensorView {
  const float* data = nullptr;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // The product of the dimensions, unchecked: call only on validated views.
  int64_t num_elements() const;
};

// Valid lengths: absent (empty shape, null data), per batch (B,) or per query
// row (B, Q).
struct LengthsView {
  const int32_t* data = nullptr;
  Shape shape;

  bool present() const { return !shape.empty(); }
};

// An allocator whose value-less construct() leaves floats uninitialized, so
// that outputs every backend overwrites anyway are not zero-filled first
// (zeroing a large output costs as much as a small attention call).
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <typename U>
  void construct(U* pointer) noexcept {
    ::new (static_cast<void*>(pointer)) U;
  }
  template <typename U, typename... Args>
  void construct(U* pointer, Args&&... args) {
    ::new (static_cast<void*>(pointer)) U(std::forward<Args>(args)...);
  }
};

using FloatBuffer = std::vector<float, DefaultInitAllocator<float>>;

struct Tensor {
  Shape shape;
  FloatBuffer data;

  static Tensor Zeros(Shape shape);
  // Elements are indeterminate until written; for outputs a backend fills.
  static Tensor Uninitialized(Shape shape);
  TensorView view() const { return TensorView{data.data(), shape}; }
  bool empty() const { return shape.empty(); }
};

}  // namespace attn

#endif  // ATTN_TENSOR_H_
