#include "attn/minimum_work_backend.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "attn/work.h"

namespace attn {

MinimumWorkBackend::MinimumWorkBackend(std::unique_ptr<Backend> wrapped,
                                       MinimumWork min_work)
    : wrapped_(std::move(wrapped)), min_work_(min_work) {}

namespace {

std::string Threshold(double flops) {
  if (flops == MinimumWork::kNever) return "never";
  return absl::StrFormat("from %g flops", flops);
}

}  // namespace

std::string MinimumWorkBackend::description() const {
  if (min_work_.none()) return wrapped_->description();
  const MinimumWork& w = min_work_;
  if (w.masked_softmax == w.attention && w.batch_matmul == w.attention &&
      w.additive_attention == w.attention &&
      w.nadaraya_watson == w.attention) {
    return absl::StrFormat(
        "%s; takes calls %s, smaller ones run on the next backend",
        wrapped_->description(), Threshold(w.attention));
  }
  std::vector<std::string> each;
  for (const auto& [name, threshold] : kMinimumWorkOperations) {
    each.push_back(absl::StrCat(name, " ", Threshold(w.*threshold)));
  }
  return absl::StrFormat("%s; takes %s; the rest run on the next backend",
                         wrapped_->description(), absl::StrJoin(each, ", "));
}

template <typename Params>
absl::StatusOr<const char*> MinimumWorkBackend::Route(
    const Params& params, double min_flops,
    absl::StatusOr<const char*> (Backend::*method)(const Params&)) {
  // A plain message: toy calls take this path on every request, and the
  // engine drops the status anyway.
  if (EstimatedFlops(params) < min_flops &&
      !take_every_call_.load(std::memory_order_relaxed)) {
    return absl::UnimplementedError("below the backend's minimum work");
  }
  return ((*wrapped_).*method)(params);
}

absl::StatusOr<const char*> MinimumWorkBackend::MaskedSoftmax(
    const MaskedSoftmaxParams& params) {
  return Route(params, min_work_.masked_softmax, &Backend::MaskedSoftmax);
}

absl::StatusOr<const char*> MinimumWorkBackend::BatchMatmul(
    const BatchMatmulParams& params) {
  return Route(params, min_work_.batch_matmul, &Backend::BatchMatmul);
}

absl::StatusOr<const char*> MinimumWorkBackend::ScaledDotProductAttention(
    const AttentionParams& params) {
  // A held memory's call moves only its queries and results: the memory is
  // already on the device (or the device declines it), so no threshold
  // sized for copying the keys in applies, unless attention is kept off
  // the device altogether.
  if (params.held != nullptr && min_work_.attention != MinimumWork::kNever) {
    return wrapped_->ScaledDotProductAttention(params);
  }
  return Route(params, min_work_.attention,
               &Backend::ScaledDotProductAttention);
}

absl::StatusOr<const char*> MinimumWorkBackend::AdditiveAttention(
    const AdditiveAttentionParams& params) {
  return Route(params, min_work_.additive_attention,
               &Backend::AdditiveAttention);
}

absl::StatusOr<const char*> MinimumWorkBackend::NadarayaWatson(
    const NadarayaWatsonParams& params) {
  return Route(params, min_work_.nadaraya_watson, &Backend::NadarayaWatson);
}

}  // namespace attn
