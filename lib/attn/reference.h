// The reference backend: obvious loops that accumulate in double. It is the
// oracle every optimized backend is tested against, and the last entry of
// every Engine's backend list, so it takes every valid params struct.
//
// For Precision::kBFloat16 it rounds the matrix-product operands (inputs
// only) to bfloat16 and still accumulates in double, which is the exact value
// the reduced-precision products approximate.
//
// Thread-safe and stateless; every method blocks and returns OK.
#ifndef ATTN_REFERENCE_H_
#define ATTN_REFERENCE_H_

#include <string>

#include "attn/backend.h"

namespace attn {

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }

  absl::Status MaskedSoftmax(const MaskedSoftmaxParams& params) override;
  absl::Status BatchMatmul(const BatchMatmulParams& params) override;
  absl::Status ScaledDotProductAttention(
      const AttentionParams& params) override;
  absl::Status AdditiveAttention(
      const AdditiveAttentionParams& params) override;
  absl::Status NadarayaWatson(const NadarayaWatsonParams& params) override;
};

// The kernel value K(u) of the Nadaraya-Watson kernels, in double.
double RegressionKernelValue(RegressionKernel kernel, double u);

}  // namespace attn

#endif  // ATTN_REFERENCE_H_
