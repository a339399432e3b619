// One instruction set's copy of the CPU kernels: its implementations (put
// in order by implementation_order.cc) and the helpers its files share.
//
// Internal to the kernel sources (lib/CMakeLists.txt's ATTN_KERNEL_SOURCES):
// include it inside the ISA region (attn/internal/isa.h), with
// attn/internal/cpu/implementation.h, attn/params.h, <algorithm> and
// <cstdint> included before the region.
#ifndef ATTN_INTERNAL_CPU_KERNEL_COPY_H_
#define ATTN_INTERNAL_CPU_KERNEL_COPY_H_

#include <algorithm>
#include <cstdint>

#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// The implementations, each in its own file under attn/internal/cpu/.
extern const CpuImplementation<MaskedSoftmaxParams> kMaskedSoftmax;
extern const CpuImplementation<AttentionParams> kWeightsBlocks;
extern const CpuImplementation<AttentionParams> kKeyShares;
extern const CpuImplementation<AttentionParams> kAmxColumns;
extern const CpuImplementation<AttentionParams> kAmxBlocks;
extern const CpuImplementation<AttentionParams> kLaneAttention;
extern const CpuImplementation<AttentionParams> kColumns;
extern const CpuImplementation<AttentionParams> kFusedBlocks;
extern const CpuImplementation<AdditiveAttentionParams> kAdditiveAttention;
extern const CpuImplementation<NadarayaWatsonParams> kRegression;

// Softmax of scale * row[0, limit) in place (scale > 0); row[limit, columns)
// = 0. A row with limit 0 becomes all zeros. Returns the raw max and the sum
// of exp((x - max) * scale) it normalised by (-inf and 0 for limit 0), for
// a log-sum-exp. (masked_softmax.cc)
struct RowSoftmax {
  float max;
  float sum;
};
RowSoftmax SoftmaxPrefixInPlace(float* row, int64_t limit, int64_t columns,
                                float scale);

// Runs body(task) for task in [0, tasks) on `threads` OpenMP threads, with
// dynamic scheduling (causal and valid-length masks make tasks uneven).
template <typename Body>
void ParallelFor(int64_t tasks, int threads, const Body& body) {
  if (threads <= 1 || tasks <= 1) {
    for (int64_t task = 0; task < tasks; ++task) body(task);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) body(task);
}

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_KERNEL_COPY_H_
