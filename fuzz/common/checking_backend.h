// A kernel backend for fuzzing: instead of computing, it checks the
// validated params struct it is handed (attn/params.h's promises: every
// dimension >= 1, every valid length within [0, columns]) and touches every
// input element and every output element the params claim, so that
// AddressSanitizer reports any view shorter than its shape. It writes zeros
// to the outputs.
//
// Small calls (fewer than `reference_below_flops` nominal operations) are
// declined with UNIMPLEMENTED, so that the Engine runs them on the reference
// backend: real kernels on fuzzed shapes and valid lengths, at a bounded cost
// per input.
//
// It also checks that the server never computes a result larger than the
// response limit it will then refuse to send (`max_output_bytes`, the
// service's max_response_bytes): outputs and weights of more than that many
// bytes must have been refused before any kernel ran.
//
// A broken promise aborts the process (FUZZ_CHECK: a crash to libFuzzer)
// with a message naming it.
#ifndef ATTN_FUZZ_COMMON_CHECKING_BACKEND_H_
#define ATTN_FUZZ_COMMON_CHECKING_BACKEND_H_

#include <cstdint>
#include <string>

#include "attn/backend.h"
#include "fuzz/common/check.h"

namespace attn_fuzz {

class CheckingBackend final : public attn::Backend {
 public:
  static constexpr char kName[] = "fuzz-check";

  CheckingBackend(double reference_below_flops, int64_t max_output_bytes)
      : reference_below_flops_(reference_below_flops),
        max_output_bytes_(max_output_bytes) {}

  std::string name() const override { return kName; }

  absl::StatusOr<const char*> MaskedSoftmax(const attn::MaskedSoftmaxParams& p) override;
  absl::StatusOr<const char*> BatchMatmul(const attn::BatchMatmulParams& p) override;
  absl::StatusOr<const char*> ScaledDotProductAttention(
      const attn::AttentionParams& p) override;
  absl::StatusOr<const char*> AdditiveAttention(
      const attn::AdditiveAttentionParams& p) override;
  absl::StatusOr<const char*> NadarayaWatson(const attn::NadarayaWatsonParams& p) override;

 private:
  // Aborts when `elements` float32 results exceed max_output_bytes_.
  void CheckOutputSize(const char* op, int64_t elements) const;

  const double reference_below_flops_;
  const int64_t max_output_bytes_;
};

}  // namespace attn_fuzz

#endif  // ATTN_FUZZ_COMMON_CHECKING_BACKEND_H_
