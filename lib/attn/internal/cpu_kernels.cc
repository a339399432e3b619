#include "attn/internal/cpu_kernels.h"

namespace attn::internal {

namespace baseline {
extern const CpuKernels kKernels;
}  // namespace baseline
#if ATTN_HAVE_AVX2_KERNELS
namespace avx2 {
extern const CpuKernels kKernels;
}  // namespace avx2
#endif
#if ATTN_HAVE_AVX512_KERNELS
namespace avx512 {
extern const CpuKernels kKernels;
}  // namespace avx512
#endif

const CpuKernels& CpuKernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      break;
    case CpuIsa::kAvx2:
#if ATTN_HAVE_AVX2_KERNELS
      return avx2::kKernels;
#else
      break;
#endif
    case CpuIsa::kAvx512:
#if ATTN_HAVE_AVX512_KERNELS
      return avx512::kKernels;
#else
      break;
#endif
  }
  return baseline::kKernels;
}

}  // namespace attn::internal
