// The serving core without gRPC (server/core/call_runner.h): 64 single
// attention requests (B = 1) in flight through CallRunner::RunOp, with
// the server's defaults (2 workers, kernels on 1 thread each), batching off
// and on. Shows what batching buys the kernels alone on this CPU, without the
// transport's cost. Reported: requests/s (items_per_second) per 64-request
// wave. Not part of the test suite:
//
//   build/bench/core_benchmark --benchmark_min_time=2
#include <atomic>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "attn/engine.h"
#include "attn/testing/random.h"
#include "benchmark/benchmark.h"
#include "server/core/batcher.h"
#include "server/core/call_runner.h"
#include "server/core/clock.h"
#include "server/core/metrics.h"
#include "server/core/worker_pool.h"

namespace attnserve {
namespace {

constexpr int kInFlight = 64;

// Counts answers; the last of a wave wakes the benchmark.
class WaveResponder final : public CallResponder {
 public:
  void Start(int calls) {
    remaining_.store(calls);
    done_ = std::make_unique<absl::Notification>();
  }
  void Wait() { done_->WaitForNotification(); }
  int failures() const { return failures_.load(); }

  absl::Status Computed(const CallRecord&) override { return absl::OkStatus(); }
  void Answer(const absl::Status& status, const CallRecord&,
              Admission::Ticket) override {
    if (!status.ok()) failures_.fetch_add(1);
    if (remaining_.fetch_sub(1) == 1) done_->Notify();
  }

 private:
  std::atomic<int> remaining_{0};
  std::atomic<int> failures_{0};
  std::unique_ptr<absl::Notification> done_;
};

// args: length (Lq = Lk), depth (d = v), batching (0 off, 1 on).
void BM_CoreAttention(benchmark::State& state) {
  const int64_t length = state.range(0), depth = state.range(1);
  const bool batching = state.range(2) != 0;
  attn::EngineOptions engine_options;
  engine_options.max_threads = 1;  // attnserve's --kernel_threads default
  auto engine = attn::Engine::Create(engine_options).value();
  auto metrics = ServiceMetrics::Create({"onednn-cpu", "reference"}).value();
  auto pool = WorkerPool::Create(WorkerPool::Options{}).value();
  RealClock clock;
  std::unique_ptr<Batcher> batcher;
  if (batching) {
    batcher = Batcher::Create(
                  BatchingOptions{}, engine.get(), &clock,
                  [raw = pool.get()](std::function<void()> work,
                        uint64_t priority) {
                    return raw->Schedule(std::move(work), priority);
                  },
                  {}, [raw = pool.get()] { return raw->available_threads() > 0; })
                  .value();
    pool->SetIdleCallback([raw = batcher.get()] { raw->OnExecutorIdle(); });
    batcher->StartScheduler();
  }
  CallRunner calls(engine.get(), pool.get(), batcher.get(), metrics.get(),
                   ServiceLimits{});

  std::mt19937 rng(0);
  std::vector<attn::Tensor> q, k, v;
  for (int i = 0; i < kInFlight; ++i) {
    q.push_back(attn::testing::RandomNormal(rng, {1, length, depth}));
    k.push_back(attn::testing::RandomNormal(rng, {1, length, depth}));
    v.push_back(attn::testing::RandomNormal(rng, {1, length, depth}));
  }
  WaveResponder responder;
  for (auto _ : state) {
    responder.Start(kInFlight);
    for (int i = 0; i < kInFlight; ++i) {
      calls.RunOp(
          Rpc::kScaledDotProductAttention, CallContext{},
          [&, i](ElementBudget*) -> absl::StatusOr<BatchableRequest> {
            attn::AttentionRequest request;
            request.queries = q[i].view();
            request.keys = k[i].view();
            request.values = v[i].view();
            return request;
          },
          [](const attn::OpResult& result) { benchmark::DoNotOptimize(result); },
          {}, &responder);
    }
    responder.Wait();
  }
  if (responder.failures() > 0) state.SkipWithError("a request failed");
  state.SetItemsProcessed(state.iterations() * kInFlight);
  if (batcher != nullptr) batcher->Shutdown();
  pool->Shutdown();
}

BENCHMARK(BM_CoreAttention)
    ->ArgNames({"L", "d", "batching"})
    ->Args({10, 2, 0})  // the textbook's toy scale
    ->Args({10, 2, 1})
    ->Args({64, 64, 0})  // medium rows
    ->Args({64, 64, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();
