// The hand-written CPU kernels behind OneDnnBackend: the loops oneDNN cannot
// express (valid-length masks, online softmax, tanh scores, regression
// kernels), with oneDNN matmul primitives (attn/internal/block_matmul.h) and
// sgemm for the small matrix products inside them.
//
// They are compiled once per instruction set (attn/internal/isa.h) and reached
// through a table of entry points, one table per copy. `threads` is the number
// of OpenMP threads to use; 1 runs on the calling thread alone. Params are
// validated (attn/validate.h). Each entry blocks, writes every element of
// every non-null output, and is safe to call concurrently (scratch is per
// call). Status codes: INTERNAL when oneDNN fails.
#ifndef ATTN_INTERNAL_CPU_KERNELS_H_
#define ATTN_INTERNAL_CPU_KERNELS_H_

#include "absl/status/status.h"
#include "attn/cpu_isa.h"
#include "attn/params.h"

namespace attn::internal {

// How attention runs Precision::kBFloat16 (the kernels do not read the
// params' precision).
enum class BFloat16Mode {
  kOff,       // products on the inputs as given, in float32
  kNative,    // bfloat16 copies, bfloat16 products (AVX512-BF16 or AMX)
  kEmulated,  // copies rounded to bfloat16 kept as floats, float32 products
};

struct CpuKernels {
  // Masked softmax of every row (any ValidLengths kind).
  void (*masked_softmax)(const MaskedSoftmaxParams& params, int threads);
  // Blocked attention. Without weights it is FlashAttention's online softmax
  // over key blocks: extra memory per thread is O(query block x (key block +
  // dv)) whatever Lq and Lk are. With weights, the scores of a query block
  // are written straight into the weights output and normalised in place.
  // Key blocks past every row's limit (valid length, causal) are never
  // computed. kNative (for Precision::kBFloat16 on CPUs with bfloat16
  // hardware: HasNativeBFloat16Products()): Q, K and V are rounded to
  // bfloat16 copies and both products run in bfloat16 with float32
  // accumulation; softmax stays in float32 and the probabilities are rounded
  // to bfloat16 for the second product (as PyTorch's and oneDNN Graph's
  // bf16 attention do). kEmulated: the copies are the floats the inputs round
  // to, multiplied in float32.
  absl::Status (*attention)(const AttentionParams& params,
                            BFloat16Mode bfloat16, int threads);
  // Additive attention: projections W_q q and W_k k with sgemm, fused
  // tanh-score rows, masked softmax, and the value product with sgemm.
  absl::Status (*additive_attention)(const AdditiveAttentionParams& params,
                                     int threads);
  // Nadaraya-Watson prediction, one query row at a time.
  absl::Status (*nadaraya_watson)(const NadarayaWatsonParams& params,
                                  int threads);
};

// The copy compiled for `isa`. `isa` must be one of CompiledCpuIsas() and
// supported by this CPU (SelectCpuIsa's answer is).
const CpuKernels& CpuKernelsFor(CpuIsa isa);

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_CPU_KERNELS_H_
