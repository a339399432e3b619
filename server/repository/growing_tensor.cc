#include "server/repository/growing_tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

namespace attnserve {

GrowingTensor::GrowingTensor(const StoredTensor& tensor, int64_t max_bytes)
    : row_shape_(tensor.shape.begin() + 1, tensor.shape.end()),
      bfloat16_(tensor.is_bfloat16()) {
  int64_t row_elements = 1;
  for (int64_t dim : row_shape_) row_elements *= dim;
  row_bytes_ = static_cast<size_t>(row_elements) *
               (bfloat16_ ? sizeof(uint16_t) : sizeof(float));
  const int64_t rows = tensor.shape[0];
  const int64_t room = rows + rows / 4 + 16;
  Reallocate(room,
             std::max(static_cast<size_t>(std::max<int64_t>(max_bytes, 0)),
                      static_cast<size_t>(room) * row_bytes_));
  Append(tensor);
}

void GrowingTensor::Reallocate(int64_t rows, size_t reserve_bytes) {
  std::shared_ptr<uint8_t> memory;
  // Address space only: MAP_NORESERVE commits no memory, and the kernel
  // gives a page when a row is first written there.
  void* range = mmap(nullptr, reserve_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (range != MAP_FAILED) {
    memory.reset(static_cast<uint8_t*>(range),
                 [reserve_bytes](uint8_t* at) { munmap(at, reserve_bytes); });
    reserved_ = true;
    rows = std::max<int64_t>(rows, reserve_bytes / row_bytes_);
  } else {
    // Uninitialized: every byte a view reads is written first. new[]'s
    // alignment serves float and bfloat16 alike.
    memory.reset(new uint8_t[static_cast<size_t>(rows) * row_bytes_],
                 std::default_delete<uint8_t[]>());
    reserved_ = false;
  }
  if (rows_ > 0) {
    std::memcpy(memory.get(), memory_.get(),
                static_cast<size_t>(rows_) * row_bytes_);
  }
  memory_ = std::move(memory);
  capacity_ = rows;
}

void GrowingTensor::Append(const StoredTensor& rows) {
  const int64_t added = rows.shape[0];
  if (rows_ + added > capacity_) {
    // Past the reservation (or in a plain buffer): 1.5x, amortized
    // O(rows appended), at most half the rows spare.
    const int64_t room = std::max(capacity_ + capacity_ / 2, rows_ + added);
    Reallocate(room, static_cast<size_t>(room) * row_bytes_);
  }
  const absl::string_view bytes = rows.bytes();
  std::memcpy(memory_.get() + static_cast<size_t>(rows_) * row_bytes_,
              bytes.data(), bytes.size());
  rows_ += added;
}

StoredTensor GrowingTensor::View() const {
  attn::Shape shape{rows_};
  shape.insert(shape.end(), row_shape_.begin(), row_shape_.end());
  // Aliases the memory's ownership: the view keeps it alive.
  std::shared_ptr<const void> owner = memory_;
  if (bfloat16_) {
    return StoredTensor(std::move(shape),
                        reinterpret_cast<const uint16_t*>(memory_.get()),
                        std::move(owner));
  }
  return StoredTensor(std::move(shape),
                      reinterpret_cast<const float*>(memory_.get()),
                      std::move(owner));
}

}  // namespace attnserve
