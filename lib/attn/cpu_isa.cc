#include "attn/cpu_isa.h"

#include <algorithm>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attn {
namespace {

constexpr CpuIsa kEveryIsa[] = {CpuIsa::kBaseline, CpuIsa::kAvx2,
                                CpuIsa::kAvx512, CpuIsa::kAmx};

// AMX-TILE and AMX-BF16 in CPUID, the tile state enabled in XCR0, and Linux
// granting this process that state (without the grant, the first tile
// instruction faults). Asked once.
bool AmxTilesUsable() {
#if defined(__x86_64__)
  static const bool usable = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
    constexpr unsigned kOsXsave = 1u << 27;
    if ((edx & (kAmxBf16 | kAmxTile)) != (kAmxBf16 | kAmxTile)) return false;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & kOsXsave) == 0) {
      return false;
    }
    unsigned xcr0_low, xcr0_high;
    __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    constexpr unsigned kTileConfigAndData = 3u << 17;  // XTILECFG, XTILEDATA
    if ((xcr0_low & kTileConfigAndData) != kTileConfigAndData) return false;
    constexpr long kArchRequestXcompPermission = 0x1023;
    constexpr long kXfeatureTileData = 18;
    return syscall(SYS_arch_prctl, kArchRequestXcompPermission,
                   kXfeatureTileData) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
#if defined(__x86_64__) || defined(__i386__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(__x86_64__) || defined(__i386__)
      // GCC's check includes the OS saving the AVX-512 registers (XGETBV).
      return CpuSupports(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
    case CpuIsa::kAmx:
      return CpuSupports(CpuIsa::kAvx512) && AmxTilesUsable();
  }
  return false;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return "baseline";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "unknown";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  std::vector<std::string> names;
  for (CpuIsa isa : kEveryIsa) {
    if (lower == CpuIsaName(isa)) return isa;
    names.push_back(CpuIsaName(isa));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CPU instruction set \"", name, "\"; expected one of ",
                   absl::StrJoin(names, ", ")));
}

std::vector<CpuIsa> CompiledCpuIsas() {
  std::vector<CpuIsa> isas = {CpuIsa::kBaseline};
#if ATTN_HAVE_AVX2_KERNELS
  isas.push_back(CpuIsa::kAvx2);
#endif
#if ATTN_HAVE_AVX512_KERNELS
  isas.push_back(CpuIsa::kAvx512);
  isas.push_back(CpuIsa::kAmx);  // the avx512 copy's AMX kernels
#endif
  return isas;
}

CpuIsa DetectCpuIsa() {
  CpuIsa best = CpuIsa::kBaseline;
  for (CpuIsa isa : CompiledCpuIsas()) {
    if (CpuSupports(isa)) best = std::max(best, isa);
  }
  return best;
}

absl::StatusOr<CpuIsa> SelectCpuIsa(std::optional<CpuIsa> cap) {
  CpuIsa isa = DetectCpuIsa();
  if (cap.has_value()) isa = std::min(isa, *cap);
  const char* variable = std::getenv(kMaxCpuIsaVariable);
  if (variable != nullptr && *variable != '\0') {
    absl::StatusOr<CpuIsa> env_cap = ParseCpuIsa(variable);
    if (!env_cap.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kMaxCpuIsaVariable, ": ", env_cap.status().message()));
    }
    isa = std::min(isa, *env_cap);
  }
  return isa;
}

}  // namespace attn
