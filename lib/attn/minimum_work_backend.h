// A backend that declines the calls too small to be worth it: every call
// estimated (attn/work.h) at fewer floating-point operations than a threshold
// gets UNIMPLEMENTED, so the engine's next backend runs it; the rest go to the
// backend it wraps.
//
// Why: a GPU call pays a fixed round trip (staging, copies both ways, kernel
// launches, a stream synchronisation: tens of microseconds) that a toy
// request, done on the CPU in a few microseconds, never repays. The engine
// wraps the CUDA backend in one (EngineOptions::cuda_min_flops); the server's
// flag --cuda_min_flops sets the threshold, and
// bench/cuda_crossover_bench measures where the GPU starts to win.
//
// Thread safety: as the wrapped backend's (the threshold is immutable; the
// warm-up switch is atomic).
#ifndef ATTN_MINIMUM_WORK_BACKEND_H_
#define ATTN_MINIMUM_WORK_BACKEND_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "attn/backend.h"

namespace attn {

class MinimumWorkBackend final : public Backend {
 public:
  // `min_flops` <= 0 passes every call on to `wrapped`.
  MinimumWorkBackend(std::unique_ptr<Backend> wrapped, double min_flops);

  // The wrapped backend's (name and implementations): results and metrics
  // name what ran.
  std::string name() const override { return wrapped_->name(); }
  std::vector<std::string> implementation_names() const override {
    return wrapped_->implementation_names();
  }
  // The wrapped backend's, and the threshold.
  std::string description() const override;
  std::optional<HeldMemoryStats> held_memory_stats() const override {
    return wrapped_->held_memory_stats();
  }
  bool SpreadsKeysAcrossThreads(const AttentionParams& params) const override {
    return wrapped_->SpreadsKeysAcrossThreads(params);
  }

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

  double min_flops() const { return min_flops_; }

  // While true, every call goes to the wrapped backend: Engine::WarmUp's
  // small calls must reach the GPU. Calls running meanwhile are routed
  // either way, and both ways give a valid result.
  void set_take_every_call(bool take) {
    take_every_call_.store(take, std::memory_order_relaxed);
  }

 private:
  // UNIMPLEMENTED below the threshold, else `method` of the wrapped backend.
  template <typename Params>
  absl::StatusOr<const char*> Route(
      const Params& params,
      absl::StatusOr<const char*> (Backend::*method)(const Params&));

  const std::unique_ptr<Backend> wrapped_;
  const double min_flops_;
  std::atomic<bool> take_every_call_{false};
};

}  // namespace attn

#endif  // ATTN_MINIMUM_WORK_BACKEND_H_
