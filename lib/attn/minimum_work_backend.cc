#include "attn/minimum_work_backend.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "attn/work.h"

namespace attn {

MinimumWorkBackend::MinimumWorkBackend(std::unique_ptr<Backend> wrapped,
                                       double min_flops)
    : wrapped_(std::move(wrapped)), min_flops_(min_flops) {}

std::string MinimumWorkBackend::description() const {
  if (min_flops_ <= 0) return wrapped_->description();
  return absl::StrFormat(
      "%s; takes calls from %g flops, smaller ones run on the next backend",
      wrapped_->description(), min_flops_);
}

template <typename Params>
absl::StatusOr<const char*> MinimumWorkBackend::Route(
    const Params& params,
    absl::StatusOr<const char*> (Backend::*method)(const Params&)) {
  // A plain message: toy calls take this path on every request, and the
  // engine drops the status anyway.
  if (EstimatedFlops(params) < min_flops_ &&
      !take_every_call_.load(std::memory_order_relaxed)) {
    return absl::UnimplementedError("below the backend's minimum work");
  }
  return ((*wrapped_).*method)(params);
}

absl::StatusOr<const char*> MinimumWorkBackend::MaskedSoftmax(
    const MaskedSoftmaxParams& params) {
  return Route(params, &Backend::MaskedSoftmax);
}

absl::StatusOr<const char*> MinimumWorkBackend::BatchMatmul(
    const BatchMatmulParams& params) {
  return Route(params, &Backend::BatchMatmul);
}

absl::StatusOr<const char*> MinimumWorkBackend::ScaledDotProductAttention(
    const AttentionParams& params) {
  // A held memory's call moves only its queries and results: the memory is
  // already on the device (or the device declines it), so no threshold
  // sized for copying the keys in applies.
  if (params.held != nullptr) {
    return wrapped_->ScaledDotProductAttention(params);
  }
  return Route(params, &Backend::ScaledDotProductAttention);
}

absl::StatusOr<const char*> MinimumWorkBackend::AdditiveAttention(
    const AdditiveAttentionParams& params) {
  return Route(params, &Backend::AdditiveAttention);
}

absl::StatusOr<const char*> MinimumWorkBackend::NadarayaWatson(
    const NadarayaWatsonParams& params) {
  return Route(params, &Backend::NadarayaWatson);
}

}  // namespace attn
