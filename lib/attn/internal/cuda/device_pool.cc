#include "attn/internal/cuda/device_pool.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attn::cuda_internal {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_class_(std::exchange(other.size_class_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) pool_->Release(data_, size_class_);
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_class_ = std::exchange(other.size_class_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (pool_ != nullptr) pool_->Release(data_, size_class_);
}

DevicePool::DevicePool(int64_t max_cached_bytes)
    : max_cached_bytes_(max_cached_bytes) {}

DevicePool::~DevicePool() {
  absl::MutexLock lock(&mutex_);
  FreeCachedLocked();
}

size_t DevicePool::SizeClass(size_t bytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  if (bytes <= 256) return 256;
  if (bytes <= kMiB) {
    size_t size = 512;
    while (size < bytes) size *= 2;
    return size;
  }
  return (bytes + kMiB - 1) / kMiB * kMiB;
}

void DevicePool::FreeCachedLocked() {
  for (auto& [size_class, blocks] : free_blocks_) {
    for (void* block : blocks) cudaFree(block);
  }
  free_blocks_.clear();
  stats_.bytes_cached = 0;
}

absl::StatusOr<DeviceBuffer> DevicePool::Allocate(size_t bytes) {
  const size_t size_class = SizeClass(std::max<size_t>(bytes, 1));
  absl::MutexLock lock(&mutex_);
  void* data = nullptr;
  auto it = free_blocks_.find(size_class);
  if (it != free_blocks_.end() && !it->second.empty()) {
    data = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= static_cast<int64_t>(size_class);
  } else {
    cudaError_t status = cudaMalloc(&data, size_class);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the (non-sticky) error, then retry empty
      FreeCachedLocked();
      status = cudaMalloc(&data, size_class);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda: cannot allocate ", size_class, " bytes of device memory (",
          stats_.bytes_in_use, " bytes in use by this server)"));
    }
    if (status != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cuda: cudaMalloc: ", cudaGetErrorString(status)));
    }
  }
  stats_.bytes_in_use += static_cast<int64_t>(size_class);
  stats_.peak_bytes_in_use =
      std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return DeviceBuffer(this, data, size_class);
}

void DevicePool::Release(void* data, size_t size_class) {
  absl::MutexLock lock(&mutex_);
  stats_.bytes_in_use -= static_cast<int64_t>(size_class);
  if (stats_.bytes_cached + static_cast<int64_t>(size_class) >
      max_cached_bytes_) {
    cudaFree(data);
    return;
  }
  free_blocks_[size_class].push_back(data);
  stats_.bytes_cached += static_cast<int64_t>(size_class);
}

DevicePool::Stats DevicePool::stats() const {
  absl::MutexLock lock(&mutex_);
  return stats_;
}

void DevicePool::ResetPeak() {
  absl::MutexLock lock(&mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

}  // namespace attn::cuda_internal
