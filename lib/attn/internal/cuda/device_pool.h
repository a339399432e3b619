// A caching allocator for device memory, so that steady-state requests never
// call cudaMalloc (which synchronises the device and costs ~100 us).
//
// Sizes are rounded up to a size class (powers of two up to 1 MiB, then
// multiples of 1 MiB); a freed block returns to its class's free list and is
// handed to the next request of that class. Free blocks beyond
// max_cached_bytes are released. When cudaMalloc fails, every cached block is
// released and the allocation retried once before RESOURCE_EXHAUSTED.
//
// Thread safety: every method may be called concurrently. A DeviceBuffer must
// be released (destroyed) only after the work that uses it has completed: the
// backend synchronises its stream before its buffers go out of scope.
#ifndef ATTN_INTERNAL_CUDA_DEVICE_POOL_H_
#define ATTN_INTERNAL_CUDA_DEVICE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace attn::cuda_internal {

class DevicePool;

// A block of device memory on loan from a DevicePool; returns it on
// destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void* data() const { return data_; }

 private:
  friend class DevicePool;
  DeviceBuffer(DevicePool* pool, void* data, size_t size_class)
      : pool_(pool), data_(data), size_class_(size_class) {}

  DevicePool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t size_class_ = 0;
};

class DevicePool {
 public:
  struct Stats {
    int64_t bytes_in_use = 0;       // on loan, by size class
    int64_t peak_bytes_in_use = 0;  // since creation or ResetPeak()
    int64_t bytes_cached = 0;       // free, kept for reuse
  };

  explicit DevicePool(int64_t max_cached_bytes);
  // Releases every cached block. Buffers still on loan must be gone first.
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A buffer of at least `bytes` (> 0) on the current device.
  // RESOURCE_EXHAUSTED when the device has no room; INTERNAL for other CUDA
  // failures.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  Stats stats() const;
  void ResetPeak();

  // The size class `bytes` is rounded up to.
  static size_t SizeClass(size_t bytes);

 private:
  friend class DeviceBuffer;
  void Release(void* data, size_t size_class);
  void FreeCachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int64_t max_cached_bytes_;
  mutable absl::Mutex mutex_;
  absl::flat_hash_map<size_t, std::vector<void*>> free_blocks_
      ABSL_GUARDED_BY(mutex_);
  Stats stats_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace attn::cuda_internal

#endif  // ATTN_INTERNAL_CUDA_DEVICE_POOL_H_
