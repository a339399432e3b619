// The reference backend: obvious loops that accumulate in double. It is the
// oracle every optimized backend is tested against, and the last entry of
// every Engine's backend list, so it takes every valid params struct.
//
// For Precision::kBFloat16 it rounds the matrix-product operands (inputs
// only) to bfloat16 and still accumulates in double, which is the exact value
// the reduced-precision products approximate.
//
// Thread-safe and stateless; every method blocks and returns OK, naming
// "reference" as both the backend and the implementation that ran.
#ifndef ATTN_REFERENCE_H_
#define ATTN_REFERENCE_H_

#include <string>

#include "attn/backend.h"

namespace attn {

class ReferenceBackend final : public Backend {
 public:
  static constexpr char kName[] = "reference";

  std::string name() const override { return kName; }

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
};

// The kernel value K(u) of the Nadaraya-Watson kernels, in double.
double RegressionKernelValue(RegressionKernel kernel, double u);

}  // namespace attn

#endif  // ATTN_REFERENCE_H_
