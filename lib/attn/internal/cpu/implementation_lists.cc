#include "attn/internal/cpu/implementation_lists.h"

#include <algorithm>

namespace attn::internal {

// Each copy's lists (implementation_order.cc).
namespace baseline {
extern const CpuImplementationLists kImplementationLists;
}  // namespace baseline
#if ATTN_HAVE_AVX2_KERNELS
namespace avx2 {
extern const CpuImplementationLists kImplementationLists;
}  // namespace avx2
#endif
#if ATTN_HAVE_AVX512_KERNELS
namespace avx512 {
extern const CpuImplementationLists kImplementationLists;
}  // namespace avx512
#endif

const CpuImplementationLists& CpuImplementationListsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      break;
    case CpuIsa::kAvx2:
#if ATTN_HAVE_AVX2_KERNELS
      return avx2::kImplementationLists;
#else
      break;
#endif
    case CpuIsa::kAvx512:
    case CpuIsa::kAmx:  // the same copy; its AMX kernels check the features
#if ATTN_HAVE_AVX512_KERNELS
      return avx512::kImplementationLists;
#else
      break;
#endif
  }
  return baseline::kImplementationLists;
}

namespace {

template <typename Params>
void AddNames(CpuImplementationList<Params> list,
              std::vector<std::string>& names) {
  for (const CpuImplementation<Params>* implementation : list) {
    if (std::find(names.begin(), names.end(), implementation->name) ==
        names.end()) {
      names.push_back(implementation->name);
    }
  }
}

}  // namespace

std::vector<std::string> ImplementationNames(
    const CpuImplementationLists& lists) {
  std::vector<std::string> names;
  AddNames(lists.masked_softmax, names);
  AddNames(lists.batch_matmul, names);
  AddNames(lists.attention, names);
  AddNames(lists.additive_attention, names);
  AddNames(lists.nadaraya_watson, names);
  return names;
}

}  // namespace attn::internal
