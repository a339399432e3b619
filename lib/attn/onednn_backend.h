// The CPU backend: oneDNN 2.6 primitives (matmul, softmax) where oneDNN can
// express the operation, and hand-vectorized loops of our own where it
// cannot (valid-length masks, online softmax, tanh scores, the regression
// kernels), most with oneDNN's block products or sgemm inside.
//
// Inside, each operation has an ordered list of implementations
// (attn/internal/cpu/implementation.h; the order, and when each takes a
// call, in docs/kernels.md): the first that takes a call runs it, and
// its name is what the call reports as OpResult::implementation
// ("cpu-lane", "onednn-matmul", ...; implementation_names() lists them).
//
// Thread safety: all methods may be called concurrently. Primitives are
// created once per shape and kept in a bounded cache behind a mutex; each
// call executes them on a stream of its own (CPU streams are cheap, and a
// shared stream would serialise unrelated calls).
//
// Threads: a call estimated at fewer than single_thread_below_flops runs on
// the calling thread alone; a larger one uses up to max_threads OpenMP
// threads.
//
// Instruction sets: oneDNN dispatches its own kernels at run time (capped by
// ONEDNN_MAX_CPU_ISA); the backend's own loops run the copy SelectCpuIsa
// chooses (attn/cpu_isa.h), so the backend works on every CPU. description()
// names both.
//
// Precision::kBFloat16: attention runs real bfloat16 products (oneDNN matmul
// on AVX512-BF16 or AMX, or the lane kernel on AVX512-BF16; see
// attn/internal/cpu/attention_blocks.h) on CPUs that have them after
// ONEDNN_MAX_CPU_ISA's cap ("native"); elsewhere, and for the other
// operations and float16, the operands are rounded and the float32 kernels
// run on them, which reproduces the numerics of 16-bit products but not
// their speed ("emulated"). Status codes: INVALID_ARGUMENT from Create for
// bad options or an unknown ATTN_MAX_CPU_ISA; INTERNAL when oneDNN fails;
// RESOURCE_EXHAUSTED when scratch memory cannot be had. No method declines a
// call (every list ends in an implementation that takes all of its
// operation's calls).
#ifndef ATTN_ONEDNN_BACKEND_H_
#define ATTN_ONEDNN_BACKEND_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attn/backend.h"
#include "attn/cpu_isa.h"

namespace attn {

class OneDnnBackend final : public Backend {
 public:
  struct Options {
    int max_threads = 0;  // 0: OpenMP's default
    double single_thread_below_flops = 8e6;
    // Distinct shapes whose primitives are kept; the oldest-inserted shape is
    // dropped beyond it, so arbitrary client shapes cannot grow memory.
    int primitive_cache_capacity = 256;
    // Caps the instruction set of the backend's own kernels (unset: the best
    // this CPU has, subject to ATTN_MAX_CPU_ISA).
    std::optional<CpuIsa> max_isa;
    // Implementations (by name) never run: EngineOptions::
    // skipped_cpu_implementations.
    std::vector<std::string> skipped_implementations;
  };

  static absl::StatusOr<std::unique_ptr<OneDnnBackend>> Create(
      const Options& options);
  ~OneDnnBackend() override;

  std::string name() const override { return "onednn-cpu"; }
  // E.g. "onednn-cpu (own kernels: avx512; oneDNN: avx512_core_amx; bf16
  // attention: native)".
  std::string description() const override;
  // Every implementation's name, in list order (the same on every CPU).
  std::vector<std::string> implementation_names() const override;
  // The instruction set of the backend's own kernels.
  CpuIsa isa() const;
  // How bfloat16 attention runs here: "native" or "emulated".
  const char* bfloat16_attention() const;

  // Over at least twice kMinKeysPerShare keys (attn/work.h).
  bool SpreadsKeysAcrossThreads(const AttentionParams& params) const override;

  absl::StatusOr<const char*> MaskedSoftmax(
      const MaskedSoftmaxParams& params) override;
  absl::StatusOr<const char*> BatchMatmul(
      const BatchMatmulParams& params) override;
  absl::StatusOr<const char*> ScaledDotProductAttention(
      const AttentionParams& params) override;
  absl::StatusOr<const char*> AdditiveAttention(
      const AdditiveAttentionParams& params) override;
  absl::StatusOr<const char*> NadarayaWatson(
      const NadarayaWatsonParams& params) override;

 private:
  class Impl;
  explicit OneDnnBackend(std::unique_ptr<Impl> impl);

  const std::unique_ptr<Impl> impl_;
};

}  // namespace attn

#endif  // ATTN_ONEDNN_BACKEND_H_
