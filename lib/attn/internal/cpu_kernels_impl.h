// The entry points of one instruction set's copy of the CPU kernels (see
// attn/internal/cpu_kernels.h for their contracts); included only by the
// kernel sources, inside their ISA region (attn/internal/isa.h).
#ifndef ATTN_INTERNAL_CPU_KERNELS_IMPL_H_
#define ATTN_INTERNAL_CPU_KERNELS_IMPL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attn/internal/cpu_kernels.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// This copy's table (defined in cpu_attention.cc).
extern const CpuKernels kKernels;

// Softmax of scale * row[0, limit) in place (scale > 0); row[limit, columns)
// = 0. A row with limit 0 becomes all zeros.
void SoftmaxPrefixInPlace(float* row, int64_t limit, int64_t columns,
                          float scale);

void CpuMaskedSoftmax(const MaskedSoftmaxParams& params, int threads);
absl::Status CpuAttention(const AttentionParams& params, BFloat16Mode bfloat16,
                          int threads);
absl::Status CpuAdditiveAttention(const AdditiveAttentionParams& params,
                                  int threads);
absl::Status CpuNadarayaWatson(const NadarayaWatsonParams& params,
                               int threads);

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_KERNELS_IMPL_H_
