// The CUDA backend: every operation on an NVIDIA GPU (compute capability 8.0
// or newer), built when CMake finds nvcc (ATTN_WITH_CUDA).
//
// - Batched matmul ("cublas-matmul") and the matrix products inside the
//   unfused paths run on cuBLAS (strided batched GEMM; float32 products stay
//   float32, no TF32).
// - Dot-product attention without returned weights, head dims 32/64/128 and
//   dv == d, runs a fused FlashAttention-style kernel
//   ("cuda-fused-attention"; no lq x lk matrix in device memory): 3xTF32
//   tensor-core products for float32, 16-bit products with float32
//   accumulation for Precision::kBFloat16 / kFloat16. Other attention calls
//   ("cuda-unfused-attention") run scores (cuBLAS, or a Gaussian-distance
//   kernel), a masked-softmax kernel and a cuBLAS product.
// - Masked softmax ("cuda-masked-softmax") is a kernel of ours; additive
//   attention ("cuda-additive") and Nadaraya-Watson ("cuda-regression") are
//   cuBLAS projections plus score, softmax and normalisation kernels.
//
// The quoted names are what each call reports as the implementation that
// ran (OpResult::implementation); the host machinery (contexts, staging,
// device calls) is in attn/internal/cuda/device_call.h.
//
// Resources: device memory comes from a caching pool (no cudaMalloc per
// request once warm); each concurrently calling thread gets its own stream,
// cuBLAS handle and pinned staging buffer (so a server's batch workers each
// own one, and one worker's copies overlap another's kernels). Inputs are
// copied host -> pinned -> device asynchronously, each copy queued as soon as
// its input is staged.
//
// Thread safety: every method may be called concurrently. Methods block until
// the result is in the caller's buffers. Status codes: UNIMPLEMENTED (before
// any output is written) for what this backend does not take (Gaussian scores
// at 16-bit precision, a dimension beyond cuBLAS's int, a grid beyond CUDA's
// limits), so the engine's next backend runs it; RESOURCE_EXHAUSTED when
// device or pinned memory cannot be had; INTERNAL for a CUDA or cuBLAS
// failure.
#ifndef ATTN_CUDA_BACKEND_H_
#define ATTN_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attn/backend.h"

namespace attn {

class CudaBackend final : public Backend {
 public:
  struct Options {
    int device = 0;  // CUDA device ordinal
    // Freed device blocks kept for reuse, at most this many bytes.
    int64_t max_cached_bytes = int64_t{4} << 30;
    // Off: attention always takes the unfused path (for tests comparing the
    // two, and for debugging).
    bool fused_attention = true;
  };

  struct MemoryStats {
    int64_t bytes_in_use = 0;
    int64_t peak_bytes_in_use = 0;
    int64_t bytes_cached = 0;
  };

  // True when this build includes the CUDA code.
  static bool Compiled();

  // UNIMPLEMENTED in a build without CUDA; FAILED_PRECONDITION when no usable
  // GPU is present (no driver, no device, the ordinal out of range, compute
  // capability below 8.0, or a kernel that does not run on it), with the
  // reason in the message. Runs one small kernel to prove the device works.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const Options& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  // E.g. "cuda: NVIDIA H100 80GB HBM3, compute 9.0, 132 SMs, 79.1 GiB".
  std::string description() const override;

  // "cuda-masked-softmax", "cublas-matmul", "cuda-fused-attention",
  // "cuda-unfused-attention", "cuda-additive", "cuda-regression".
  std::vector<std::string> implementation_names() const override;

  absl::StatusOr<const char*> MaskedSoftmax(
      const MaskedSoftmaxParams& params) override;
  absl::StatusOr<const char*> BatchMatmul(
      const BatchMatmulParams& params) override;
  absl::StatusOr<const char*> ScaledDotProductAttention(
      const AttentionParams& params) override;
  absl::StatusOr<const char*> AdditiveAttention(
      const AdditiveAttentionParams& params) override;
  absl::StatusOr<const char*> NadarayaWatson(
      const NadarayaWatsonParams& params) override;

  // Device memory held by this backend's pool (inputs, outputs and scratch
  // of the calls in flight); the peak is since Create or ResetPeakMemory.
  MemoryStats memory_stats() const;
  void ResetPeakMemory();

 private:
  class Impl;

  explicit CudaBackend(std::unique_ptr<Impl> impl);

  const std::unique_ptr<Impl> impl_;
};

}  // namespace attn

#endif  // ATTN_CUDA_BACKEND_H_
