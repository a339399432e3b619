// The CUDA kernels of the cuda backend (attn/cuda_backend.h), as plain
// launchers over device pointers. Compiled by nvcc; nothing here includes
// Abseil, so the .cu files stay free of host-library headers.
//
// Every launcher enqueues work on `stream` and returns the launch error (or
// cudaSuccess); none synchronises. Tensors are row-major and contiguous.
// Sizes are int64_t; a launcher returns cudaErrorInvalidConfiguration for a
// grid it cannot express, never a silently truncated one.
#ifndef ATTN_INTERNAL_CUDA_KERNELS_H_
#define ATTN_INTERNAL_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace attn::cuda_internal {

// Element types of the operands a kernel reads.
enum class ElementType { kFloat32, kBFloat16, kFloat16 };

// Which leading keys each query row may attend: the valid length (none, per
// batch entry, or per (batch entry, row)) intersected with the causal mask
// j <= row. Rows are indexed (batch, head, row); valid lengths ignore heads.
struct KeyLimits {
  const int32_t* valid = nullptr;  // device memory
  enum Kind : int { kNone = 0, kPerBatch = 1, kPerRow = 2 };
  int kind = kNone;
  bool causal = false;
};

// out = masked softmax of x over the last axis, x viewed as
// (batch, heads, rows, columns). Positions at or past the row's limit are 0;
// a row with limit 0 is all zeros. x == out is allowed.
cudaError_t LaunchMaskedSoftmax(const float* x, float* out, int64_t batch,
                                int64_t heads, int64_t rows, int64_t columns,
                                KeyLimits limits, cudaStream_t stream);

// Rounds `count` floats to bfloat16 or float16 (round to nearest even).
cudaError_t LaunchConvert(const float* in, void* out, int64_t count,
                          ElementType to, cudaStream_t stream);

// The operands of an attention kernel: q (bh, lq, d), k (bh, lk, d),
// v (bh, lk, d) of `type`, out (bh, lq, d) float32, where bh = batch *
// heads; out = softmax(scale * q k^T) v.
struct AttentionOperands {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  float* out = nullptr;
  int64_t batch = 0, heads = 1, lq = 0, lk = 0, d = 0;
  float scale = 1.0f;
  ElementType type = ElementType::kFloat32;
};

// Fused (FlashAttention-style) forward with the key limits, never
// materialising the (lq, lk) scores. float32 operands run as 3xTF32
// tensor-core products (float32 accuracy); bfloat16/float16 operands as
// 16-bit products with float32 accumulation.
struct FusedAttentionArgs : AttentionOperands {
  KeyLimits limits;
  // How the call is cut (PlanFusedAttention): query rows per block (16 or
  // 64), and the key tiles of 64 each split of the keys walks. With more
  // than one split, each writes its partial rows (partial_out (key_splits,
  // batch * heads * lq, d) unnormalised, partial_stats (key_splits, batch *
  // heads * lq, 2): the running max in log2 units and the sum) and a second
  // kernel merges them into `out`.
  int block_rows = 64;
  int key_splits = 1;
  int64_t tiles_per_split = int64_t{1} << 40;
  float* partial_out = nullptr;
  float* partial_stats = nullptr;
};

// The head dimensions the fused kernel is compiled for (32, 64, 128).
bool FusedAttentionSupportsHeadDim(int64_t d);

// The cut of a call over a GPU of `multiprocessors` SMs with
// `shared_per_multiprocessor` bytes of shared memory each: one warp's 16
// rows per block when lq <= 16, else 64; and, when those blocks would not
// fill one wave of the GPU, the keys split so that they do (each split at
// least 256 keys, and the splits' partial rows at most a quarter of the
// keys).
struct FusedAttentionPlan {
  int block_rows = 64;
  int key_splits = 1;
  int64_t tiles_per_split = 0;
};
FusedAttentionPlan PlanFusedAttention(const FusedAttentionArgs& args,
                                      int multiprocessors,
                                      int64_t shared_per_multiprocessor);

cudaError_t LaunchFusedAttention(const FusedAttentionArgs& args,
                                 cudaStream_t stream);

// out (rows, d) from key splits' partials (partial_out (splits, rows, d)
// unnormalised, partial_stats (splits, rows, 2): running max in log2 units
// and sum), merged exactly by their log-sum-exp in double; a row no split
// saw a key of is zeros. d is 32, 64 or 128.
cudaError_t LaunchMergeKeySplits(const float* partial_out,
                                 const float* partial_stats, float* out,
                                 int64_t rows, int splits, int d,
                                 cudaStream_t stream);

// Decode attention (decode_attention.cu): out = softmax(scale * q k^T) v
// for at most kDecodeMaxRows query rows per (batch, head) over many keys,
// no mask, on the CUDA cores in float32 from operands of `type` (bfloat16
// and float16 ones widened exactly): the keys split into blocks of
// keys_per_split (PlanDecodeAttention), each writing its partial rows, then
// LaunchMergeKeySplits. partial_out (splits, bh * lq, d) and partial_stats
// (splits, bh * lq, 2) are float32 scratch, splits = ceil(lk /
// keys_per_split).
inline constexpr int64_t kDecodeMaxRows = 4;
struct DecodeAttentionArgs : AttentionOperands {
  int64_t keys_per_split = 0;
  float* partial_out = nullptr;
  float* partial_stats = nullptr;
};
// Whether the decode kernel is compiled for lq rows of head dim d.
bool DecodeAttentionTakes(int64_t lq, int64_t d);
// keys_per_split for a GPU of `multiprocessors` SMs.
int64_t PlanDecodeAttention(const DecodeAttentionArgs& args,
                            int multiprocessors);
cudaError_t LaunchDecodeAttention(const DecodeAttentionArgs& args,
                                  cudaStream_t stream);

// scores (bh, lq, lk) = -scale * ||q_i - k_j||^2 / 2 for q (bh, lq, d),
// k (bh, lk, d): the Gaussian score, computed from differences (no
// cancellation as q_i approaches k_j).
cudaError_t LaunchGaussianScores(const float* q, const float* k,
                                 float* scores, int64_t bh, int64_t lq,
                                 int64_t lk, int64_t d, float scale,
                                 cudaStream_t stream);

// scores (batch, lq, lk) = sum_h w_v[h] * tanh(qp[b, i, h] + kp[b, j, h])
// for the projected queries qp (batch, lq, h) and keys kp (batch, lk, h).
cudaError_t LaunchAdditiveScores(const float* qp, const float* kp,
                                 const float* w_v, float* scores,
                                 int64_t batch, int64_t lq, int64_t lk,
                                 int64_t h, cudaStream_t stream);

// Nadaraya-Watson weights before normalisation, (n_query, n_train):
// for the Gaussian kernel the log-weight -(w * ||x_q - x_t||)^2 / 2 (the
// caller applies a softmax); for the others the kernel value K(w * dist)
// (the caller applies NormalizeRows). `kernel` is RegressionKernel's value.
cudaError_t LaunchRegressionScores(const float* x_query, const float* x_train,
                                   float* out, int64_t n_query,
                                   int64_t n_train, int64_t dx, int kernel,
                                   float bandwidth, cudaStream_t stream);

// Divides each row of w (rows, columns) by its sum; a row summing to 0 stays
// all zeros.
cudaError_t LaunchNormalizeRows(float* w, int64_t rows, int64_t columns,
                                cudaStream_t stream);

}  // namespace attn::cuda_internal

#endif  // ATTN_INTERNAL_CUDA_KERNELS_H_
