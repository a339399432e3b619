// The CPU backend's implementation lists (attn/internal/cpu/implementation.h),
// one per operation, in the order they are tried.
//
// The order is written once, in implementation_order.cc, which is compiled
// into every instruction set's copy of the kernels (attn/internal/isa.h), so
// the lists are the same in every copy; whether a copy can run an
// implementation is that implementation's own takes() (the lane kernel has
// no baseline copy). Each list ends in an implementation that takes every
// call of its operation.
//
// Thread safety: the lists are immutable, built at compile time.
#ifndef ATTN_INTERNAL_CPU_IMPLEMENTATION_LISTS_H_
#define ATTN_INTERNAL_CPU_IMPLEMENTATION_LISTS_H_

#include <string>
#include <vector>

#include "attn/cpu_isa.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/params.h"

namespace attn::internal {

struct CpuImplementationLists {
  CpuImplementationList<MaskedSoftmaxParams> masked_softmax;
  CpuImplementationList<BatchMatmulParams> batch_matmul;
  CpuImplementationList<AttentionParams> attention;
  CpuImplementationList<AdditiveAttentionParams> additive_attention;
  CpuImplementationList<NadarayaWatsonParams> nadaraya_watson;
};

// The lists of the copy compiled for `isa`, which must be one of
// CompiledCpuIsas() and supported by this CPU (SelectCpuIsa's answer is).
const CpuImplementationLists& CpuImplementationListsFor(CpuIsa isa);

// Every implementation name in `lists`, each once, in list order.
std::vector<std::string> ImplementationNames(
    const CpuImplementationLists& lists);

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_CPU_IMPLEMENTATION_LISTS_H_
