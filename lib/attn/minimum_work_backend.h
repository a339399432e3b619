// A backend that declines the calls too small to be worth it: every call
// estimated (attn/work.h) at fewer floating-point operations than its
// operation's threshold gets UNIMPLEMENTED, so the engine's next backend runs
// it; the rest go to the backend it wraps. An infinite threshold keeps the
// operation off the wrapped backend altogether (masked softmax and batch
// matmul, measured never to win on a GPU against its host's CPU).
//
// Why: a GPU call pays a fixed round trip (staging, copies both ways, kernel
// launches, a stream synchronisation: tens of microseconds) that a toy
// request, done on the CPU in a few microseconds, never repays. The engine
// wraps the CUDA backend in one (EngineOptions::cuda_min_work); the server's
// flags --cuda_min_flops and --cuda_min_flops_by_operation set the
// thresholds, and
// bench/cuda_crossover_bench measures where the GPU starts to win.
//
// Thread safety: as the wrapped backend's (the threshold is immutable; the
// warm-up switch is atomic).
#ifndef ATTN_MINIMUM_WORK_BACKEND_H_
#define ATTN_MINIMUM_WORK_BACKEND_H_

#include <array>
#include <atomic>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>
#include <string>
#include <vector>

#include "attn/backend.h"

namespace attn {

// The least work, in flops, a call of each operation needs to run on the
// wrapped backend; <= 0 passes every call on, +infinity none.
struct MinimumWork {
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  double masked_softmax = 0;
  double batch_matmul = 0;
  double attention = 0;
  double additive_attention = 0;
  double nadaraya_watson = 0;

  // Every operation from `flops`.
  static MinimumWork All(double flops) {
    return {flops, flops, flops, flops, flops};
  }
  // True when no operation has a threshold (nothing to wrap).
  bool none() const;
  // The threshold of the operation named `operation` (as
  // kMinimumWorkOperations names them), or null for another name.
  double* Find(std::string_view operation);
};

// Every operation's name (as a server's flags and the description give it)
// and its threshold.
inline constexpr std::array<std::pair<const char*, double MinimumWork::*>, 5>
    kMinimumWorkOperations = {{
        {"masked_softmax", &MinimumWork::masked_softmax},
        {"batch_matmul", &MinimumWork::batch_matmul},
        {"attention", &MinimumWork::attention},
        {"additive_attention", &MinimumWork::additive_attention},
        {"nadaraya_watson", &MinimumWork::nadaraya_watson},
    }};

inline bool MinimumWork::none() const {
  for (const auto& [name, threshold] : kMinimumWorkOperations) {
    if (this->*threshold > 0) return false;
  }
  return true;
}

inline double* MinimumWork::Find(std::string_view operation) {
  for (const auto& [name, threshold] : kMinimumWorkOperations) {
    if (operation == name) return &(this->*threshold);
  }
  return nullptr;
}

class MinimumWorkBackend final : public Backend {
 public:
  MinimumWorkBackend(std::unique_ptr<Backend> wrapped, MinimumWork min_work);
  // Every operation from `min_flops`.
  MinimumWorkBackend(std::unique_ptr<Backend> wrapped, double min_flops)
      : MinimumWorkBackend(std::move(wrapped), MinimumWork::All(min_flops)) {}

  // The wrapped backend's (name and implementations): results and metrics
  // name what ran.
  std::string name() const override { return wrapped_->name(); }
  std::vector<std::string> implementation_names() const override {
    return wrapped_->implementation_names();
  }
  // The wrapped backend's, and the thresholds.
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

  const MinimumWork& min_work() const { return min_work_; }

  // While true, every call goes to the wrapped backend: Engine::WarmUp's
  // small calls must reach the GPU. Calls running meanwhile are routed
  // either way, and both ways give a valid result.
  void set_take_every_call(bool take) {
    take_every_call_.store(take, std::memory_order_relaxed);
  }

 private:
  // UNIMPLEMENTED below `min_flops`, else `method` of the wrapped backend.
  template <typename Params>
  absl::StatusOr<const char*> Route(
      const Params& params, double min_flops,
      absl::StatusOr<const char*> (Backend::*method)(const Params&));

  const std::unique_ptr<Backend> wrapped_;
  const MinimumWork min_work_;
  std::atomic<bool> take_every_call_{false};
};

}  // namespace attn

#endif  // ATTN_MINIMUM_WORK_BACKEND_H_
