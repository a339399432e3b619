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
//   accumulation for Precision::kBFloat16 / kFloat16. A call of few query
//   rows over many keys (a stored memory's) splits the keys across every SM
//   and merges the splits by their log-sum-exp ("cuda-split-keys"); with at
//   most 4 unmasked rows, a kernel that streams the keys once on the CUDA
//   cores in float32 does, merging the same way ("cuda-decode").
//   Other attention calls
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
// Held memories (attn/held_memory.h: a server's stored memories) stay on the
// GPU between calls: placed at their first call, float32 or bfloat16 as
// held, within a byte budget (Options::held_memory_bytes), least recently
// used evicted first; a call over a held memory copies only its queries in
// and its results out. A memory that does not fit is refused (UNIMPLEMENTED,
// so the engine's next backend, the CPU, runs the call) and said once
// through Options::on_held_memory_event.
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
#include <functional>
#include <memory>
#include <optional>
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
    // Off: the fused kernel never splits the keys (for tests comparing).
    bool split_keys = true;
    // Off: few-row calls over many keys take the split fused kernel instead
    // of the decode kernel (for tests and benchmarks comparing the two).
    bool decode_attention = true;
    // Device memory for held memories' copies; 0: half of the GPU's.
    int64_t held_memory_bytes = 0;
    // Told of placements, evictions, refusals and frees; may be empty.
    std::function<void(const HeldMemoryEvent&)> on_held_memory_event;
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
  // "cuda-split-keys", "cuda-decode", "cuda-unfused-attention",
  // "cuda-additive", "cuda-regression".
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

  std::optional<HeldMemoryStats> held_memory_stats() const override;
  // True for a call the fused kernel splits across every SM (few query rows
  // over many keys): a batch of such calls over one memory reads it once
  // for all of its rows, so the server runs them one batch at a time.
  bool SpreadsKeysAcrossThreads(const AttentionParams& params) const override;

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
