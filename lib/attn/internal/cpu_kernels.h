// The hand-written CPU kernels behind OneDnnBackend: the loops oneDNN cannot
// express (valid-length masks, online softmax, tanh scores, regression
// kernels), with oneDNN's sgemm for the small matrix products inside them.
//
// Compiled with -mavx2 -mfma: call only where the CPU has both (the backend
// checks at creation). `threads` is the number of OpenMP threads to use; 1
// runs on the calling thread alone. Params are validated (attn/validate.h).
// Each function blocks, writes every element of every non-null output, and is
// safe to call concurrently (scratch is per call).
#ifndef ATTN_INTERNAL_CPU_KERNELS_H_
#define ATTN_INTERNAL_CPU_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attn/params.h"

namespace attn::internal {

// Softmax of row[0, limit) in place; row[limit, columns) = 0. A row with
// limit 0 becomes all zeros.
void SoftmaxPrefixInPlace(float* row, int64_t limit, int64_t columns);

// Masked softmax of every row (any ValidLengths kind).
void CpuMaskedSoftmax(const MaskedSoftmaxParams& params, int threads);

// Blocked attention. Without weights it is FlashAttention's online softmax
// over key blocks: extra memory per thread is O(query block x (key block + dv))
// whatever Lq and Lk are. With weights, the scores of a query block are
// written straight into the weights output and normalised in place. Key
// blocks past every row's limit (valid length, causal) are never computed.
absl::Status CpuAttention(const AttentionParams& params, int threads);

// Additive attention: projections W_q q and W_k k with sgemm, fused
// tanh-score rows, masked softmax, and the value product with sgemm.
absl::Status CpuAdditiveAttention(const AdditiveAttentionParams& params,
                                  int threads);

// Nadaraya-Watson prediction, one query row at a time.
absl::Status CpuNadarayaWatson(const NadarayaWatsonParams& params,
                               int threads);

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_CPU_KERNELS_H_
