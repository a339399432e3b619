#include "server/repository/growing_tensor.h"

#include <algorithm>
#include <cstring>

namespace attnserve {

GrowingTensor::GrowingTensor(const StoredTensor& tensor)
    : row_shape_(tensor.shape.begin() + 1, tensor.shape.end()),
      bfloat16_(tensor.is_bfloat16()) {
  int64_t row_elements = 1;
  for (int64_t dim : row_shape_) row_elements *= dim;
  row_bytes_ = static_cast<size_t>(row_elements) *
               (bfloat16_ ? sizeof(uint16_t) : sizeof(float));
  Reserve(tensor.shape[0] + tensor.shape[0] / 4 + 16);
  Append(tensor);
}

void GrowingTensor::Reserve(int64_t rows) {
  // Uninitialized: every byte a view reads is written first. new[]'s
  // alignment serves float and bfloat16 alike.
  std::shared_ptr<uint8_t[]> bigger(
      new uint8_t[static_cast<size_t>(rows) * row_bytes_]);
  if (rows_ > 0) {
    std::memcpy(bigger.get(), buffer_.get(),
                static_cast<size_t>(rows_) * row_bytes_);
  }
  buffer_ = std::move(bigger);
  capacity_ = rows;
}

void GrowingTensor::Append(const StoredTensor& rows) {
  const int64_t added = rows.shape[0];
  if (rows_ + added > capacity_) {
    // 1.5x: amortized O(rows appended), at most half the rows spare.
    Reserve(std::max(capacity_ + capacity_ / 2, rows_ + added));
  }
  const absl::string_view bytes = rows.bytes();
  std::memcpy(buffer_.get() + static_cast<size_t>(rows_) * row_bytes_,
              bytes.data(), bytes.size());
  rows_ += added;
}

StoredTensor GrowingTensor::View() const {
  attn::Shape shape{rows_};
  shape.insert(shape.end(), row_shape_.begin(), row_shape_.end());
  if (bfloat16_) {
    return StoredTensor(std::move(shape),
                        reinterpret_cast<const uint16_t*>(buffer_.get()),
                        buffer_);
  }
  return StoredTensor(std::move(shape),
                      reinterpret_cast<const float*>(buffer_.get()), buffer_);
}

}  // namespace attnserve
