// The host side of the CUDA backend (attn/cuda_backend.h): one GPU as the
// backend holds it (cuBLAS's entry points, the device memory pool, and the
// per-thread contexts it lends to calls), DeviceCall, one operation's use of
// it, and the conversions between CUDA's and cuBLAS's errors and
// absl::Status. The CPU side keeps its machinery in attn/internal/ too.
//
// Thread safety: Device may be used from many threads at once (its context
// list is behind a mutex, its pool is thread-safe); a DeviceCall belongs to
// the thread that began it. Status codes, from every function returning one:
// RESOURCE_EXHAUSTED when device or pinned memory cannot be had; UNIMPLEMENTED
// (before any output is written) for a grid CUDA cannot launch; INTERNAL for
// any other CUDA or cuBLAS failure.
#ifndef ATTN_INTERNAL_CUDA_DEVICE_CALL_H_
#define ATTN_INTERNAL_CUDA_DEVICE_CALL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attn/internal/cuda/cublas_library.h"
#include "attn/internal/cuda/device_pool.h"
#include "attn/internal/cuda/kernels.h"
#include "attn/params.h"

namespace attn::cuda_internal {

// OK for cudaSuccess; otherwise `what` failed, as the header says.
absl::Status CudaStatus(cudaError_t error, const char* what);
absl::Status CublasStatus(const CublasLibrary& cublas, cublasStatus_t status,
                          const char* what);

// Whether every value fits cuBLAS's int dimensions; TooLargeForCublas is the
// UNIMPLEMENTED a method declines with when one does not.
bool AllFitInt(std::initializer_list<int64_t> values);
absl::Status TooLargeForCublas();

// The element type a precision's products read.
ElementType OperandType(Precision precision);

// The number of valid lengths `valid` holds for `batch` batch entries.
int64_t LengthCount(const ValidLengths& valid, int64_t batch);

// Staging bytes for float32 tensors of these element counts, and
// `length_count` valid lengths.
size_t StagingFor(std::initializer_list<int64_t> float_counts,
                  int64_t length_count = 0);

// What one calling thread uses at a time: a stream, a cuBLAS handle on it and
// a pinned staging buffer (device_call.cc).
struct Context;

// One GPU as the backend holds it.
class Device {
 public:
  // `cublas` must outlive the device (LoadCublas's does: it is the process's).
  Device(int ordinal, int64_t max_cached_bytes, const CublasLibrary* cublas);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int ordinal() const { return ordinal_; }
  const CublasLibrary& cublas() const { return *cublas_; }
  DevicePool& pool() { return pool_; }

  // Lends a context to one call (creating one when all are busy); the call
  // gives it back with Return.
  absl::StatusOr<std::unique_ptr<Context>> Borrow();
  void Return(std::unique_ptr<Context> context);

 private:
  const int ordinal_;
  const CublasLibrary* const cublas_;
  DevicePool pool_;
  absl::Mutex mutex_;
  std::vector<std::unique_ptr<Context>> idle_contexts_ ABSL_GUARDED_BY(mutex_);
};

// One operation's use of the device: a borrowed context, the pool buffers it
// allocates, and the outputs to copy back. Every method enqueues on the
// context's stream; Finish waits and copies the outputs out. The destructor
// waits for the stream too (even after an error), so no buffer returns to
// the pool while a kernel may still use it. Move-only.
class DeviceCall {
 public:
  // A call whose inputs and outputs take at most `staging_bytes` of pinned
  // staging (StagingFor).
  static absl::StatusOr<DeviceCall> Begin(Device* device,
                                          size_t staging_bytes);

  DeviceCall(DeviceCall&& other) noexcept;
  DeviceCall& operator=(DeviceCall&&) = delete;
  ~DeviceCall();

  cudaStream_t stream() const;

  // Uninitialised device memory for `count` elements of `bytes_each`.
  absl::StatusOr<void*> Scratch(int64_t count, size_t bytes_each);
  absl::StatusOr<float*> ScratchFloats(int64_t count);

  // Copies `bytes` from the host into new device memory: host -> staging
  // (synchronously) then staging -> device (queued at once, so it overlaps
  // the staging of the next input).
  absl::StatusOr<void*> Upload(const void* host, size_t bytes);
  absl::StatusOr<const float*> UploadFloats(const float* host, int64_t count);

  // The device copy of `data` (float32) as operands of `type`: the upload
  // itself for float32, else a rounded copy.
  absl::StatusOr<const void*> UploadOperand(const float* host, int64_t count,
                                            ElementType type);
  absl::StatusOr<const void*> Convert(const float* device, int64_t count,
                                      ElementType type);

  absl::StatusOr<KeyLimits> UploadLimits(const ValidLengths& valid,
                                         int64_t batch, bool causal);

  // Queues device -> staging; Finish copies staging -> `host`.
  absl::Status Download(float* host, const float* device, int64_t count);

  absl::Status Finish();

  // Row-major C (n, m, p) = alpha * A (n, m, k) x B, where B is (n, k, p),
  // or (n, p, k) used transposed when b_transposed; stride 0 broadcasts an
  // operand over the batch. Operands of `type`, C float32.
  absl::Status Gemm(ElementType type, int64_t n, int64_t m, int64_t k,
                    int64_t p, float alpha, const void* a, int64_t stride_a,
                    const void* b, int64_t stride_b, bool b_transposed,
                    float* c, int64_t stride_c);

 private:
  struct PendingDownload {
    float* host;
    const unsigned char* staged;
    size_t bytes;
  };

  DeviceCall(Device* device, std::unique_ptr<Context> context);

  Device* device_;
  std::unique_ptr<Context> context_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<PendingDownload> downloads_;
  size_t staged_ = 0;
};

}  // namespace attn::cuda_internal

#endif  // ATTN_INTERNAL_CUDA_DEVICE_CALL_H_
