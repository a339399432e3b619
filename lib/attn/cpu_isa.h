// The instruction sets the library's own CPU kernels are compiled for, and
// which of them a process runs.
//
// One binary runs on every x86-64 CPU: the kernels are compiled once per
// instruction set (see attn/internal/isa.h) and one copy is chosen at run
// time, the best this CPU supports unless a cap says otherwise. Caps exist so
// that every copy can be tested on any machine that has it:
// - the environment variable ATTN_MAX_CPU_ISA caps every engine the process
//   creates (as oneDNN's own ONEDNN_MAX_CPU_ISA caps oneDNN's kernels; the
//   two are independent);
// - EngineOptions::max_cpu_isa (the server's --max_cpu_isa) caps one engine.
//
// Thread safety: every function may be called from any thread.
#ifndef ATTN_CPU_ISA_H_
#define ATTN_CPU_ISA_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attn {

// Ordered: a later value implies every earlier one.
enum class CpuIsa {
  kBaseline,  // what every x86-64 CPU has (SSE2); the only copy elsewhere
  kAvx2,      // AVX2 and FMA: AMD Zen, Intel Haswell and later
  kAvx512,    // and AVX-512 F/BW/DQ/VL: Intel Skylake-SP and later, AMD Zen 4
  // and AMX tiles with bfloat16 products, their state granted by the OS:
  // Intel Sapphire Rapids and later. Not a copy of its own: the avx512 copy,
  // with its AMX kernels allowed (capping at avx512 turns just those off).
  kAmx,
};

// The process-wide cap's environment variable.
inline constexpr char kMaxCpuIsaVariable[] = "ATTN_MAX_CPU_ISA";

// "baseline", "avx2", "avx512", "amx".
const char* CpuIsaName(CpuIsa isa);

// Case-insensitive inverse of CpuIsaName. INVALID_ARGUMENT naming the
// accepted values otherwise.
absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name);

// The instruction sets this build has kernels for, in order.
std::vector<CpuIsa> CompiledCpuIsas();

// The best compiled instruction set this CPU supports, ignoring caps. The
// first call that finds AMX tiles asks Linux for their state
// (arch_prctl(ARCH_REQ_XCOMP_PERM), process-wide, as oneDNN does); where
// that is refused the answer is avx512.
CpuIsa DetectCpuIsa();

// The instruction set a new engine's kernels use: DetectCpuIsa(), lowered to
// `cap` when given and to ATTN_MAX_CPU_ISA when that is set and not empty.
// A cap above what the CPU has is no error (it just does not bind).
// INVALID_ARGUMENT when ATTN_MAX_CPU_ISA holds an unknown name.
absl::StatusOr<CpuIsa> SelectCpuIsa(std::optional<CpuIsa> cap);

}  // namespace attn

#endif  // ATTN_CPU_ISA_H_
