// The execution stack without gRPC (server/execution/call_runner.h): 64 single
// requests (B = 1) of each batchable operation in flight through
// CallRunner::RunOp, with the server's defaults (2 workers, kernels on 1
// thread each), batching off and on; and an empty call (the core's own cost).
// Shows what batching buys the kernels alone on this CPU, without the
// transport's cost. Reported: requests/s (items_per_second) per 64-request
// wave. Not part of the test suite:
//
//   build/bench/core_benchmark --benchmark_min_time=2
#include <atomic>
#include <cstdlib>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "attn/engine.h"
#include "attn/testing/random.h"
#include "benchmark/benchmark.h"
#include "server/execution/call_runner.h"
#include "server/process/malloc_policy.h"
#include "server/execution/execution_stack.h"

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

// The core as attnserve assembles it by default (server/execution/execution_stack.h:
// 2 workers, kernels on 1 thread each, admission), with or without batching.
std::unique_ptr<ExecutionStack> MakeCore(bool batching) {
  attn::EngineOptions engine_options;
  engine_options.max_threads = 1;  // attnserve's --kernel_threads default
  ExecutionStack::Options options;
  if (batching) options.batching = BatchingOptions{};
  return ExecutionStack::Create(options, attn::Engine::Create(engine_options).value())
      .value();
}

// Sends waves of kInFlight calls of request(i) and waits for each wave.
template <typename MakeRequest>
void RunWaves(benchmark::State& state, Operation operation, MakeRequest request) {
  std::unique_ptr<ExecutionStack> core = MakeCore(state.range(2) != 0);
  WaveResponder responder;
  for (auto _ : state) {
    responder.Start(kInFlight);
    for (int i = 0; i < kInFlight; ++i) {
      core->calls().RunOp(
          operation, CallContext{},
          [&, i](ElementBudget*) -> absl::StatusOr<OperationRequest> {
            return request(i);
          },
          [](const attn::OpResult& result) { benchmark::DoNotOptimize(result); },
          {}, &responder);
    }
    responder.Wait();
  }
  if (responder.failures() > 0) state.SkipWithError("a request failed");
  state.SetItemsProcessed(state.iterations() * kInFlight);
}

std::vector<attn::Tensor> Inputs(attn::Shape shape, int count = kInFlight) {
  std::mt19937 rng(0);
  std::vector<attn::Tensor> tensors;
  for (int i = 0; i < count; ++i) {
    tensors.push_back(attn::testing::RandomNormal(rng, shape));
  }
  return tensors;
}

// Every benchmark: args (length, depth, batching: 0 off, 1 on).

void BM_CoreAttention(benchmark::State& state) {
  const int64_t length = state.range(0), depth = state.range(1);
  const auto q = Inputs({1, length, depth}), k = Inputs({1, length, depth}),
             v = Inputs({1, length, depth});
  RunWaves(state, Operation::kScaledDotProductAttention, [&](int i) {
    attn::AttentionRequest request;
    request.queries = q[i].view();
    request.keys = k[i].view();
    request.values = v[i].view();
    return request;
  });
}

// x (1, length, length).
void BM_CoreMaskedSoftmax(benchmark::State& state) {
  const int64_t length = state.range(0);
  const auto x = Inputs({1, length, length});
  RunWaves(state, Operation::kMaskedSoftmax, [&](int i) {
    return attn::MaskedSoftmaxRequest{x[i].view(), {}};
  });
}

// (1, length, depth) x (1, depth, depth).
void BM_CoreBatchMatmul(benchmark::State& state) {
  const int64_t length = state.range(0), depth = state.range(1);
  const auto a = Inputs({1, length, depth}), b = Inputs({1, depth, depth});
  RunWaves(state, Operation::kBatchMatmul, [&](int i) {
    return attn::BatchMatmulRequest{a[i].view(), b[i].view(), {}};
  });
}

// One repository model's weights (h = depth), queries and keys of width
// depth, values of width depth.
void BM_CoreAdditiveAttention(benchmark::State& state) {
  const int64_t length = state.range(0), depth = state.range(1);
  const auto q = Inputs({1, length, depth}), k = Inputs({1, length, depth}),
             v = Inputs({1, length, depth});
  const auto w_q = Inputs({depth, depth}, 1), w_k = Inputs({depth, depth}, 1),
             w_v = Inputs({depth}, 1);
  RunWaves(state, Operation::kAdditiveAttention, [&](int i) {
    attn::AdditiveAttentionRequest request;
    request.queries = q[i].view();
    request.keys = k[i].view();
    request.values = v[i].view();
    request.w_q = w_q[0].view();
    request.w_k = w_k[0].view();
    request.w_v = w_v[0].view();
    return request;
  });
}

// `length` queries each against one training set of `depth` points.
void BM_CoreNadarayaWatson(benchmark::State& state) {
  const int64_t queries = state.range(0), points = state.range(1);
  const auto x_query = Inputs({queries});
  const auto x_train = Inputs({points}, 1), y_train = Inputs({points}, 1);
  RunWaves(state, Operation::kNadarayaWatson, [&](int i) {
    attn::NadarayaWatsonRequest request;
    request.x_train = x_train[0].view();
    request.y_train = y_train[0].view();
    request.x_query = x_query[i].view();
    return request;
  });
}

// The core's own cost per call: a Run whose work does nothing (no decode,
// no kernel), through admission, the worker queue, metrics and statistics.
void BM_CoreEmptyCall(benchmark::State& state) {
  std::unique_ptr<ExecutionStack> core = MakeCore(false);
  WaveResponder responder;
  for (auto _ : state) {
    responder.Start(kInFlight);
    for (int i = 0; i < kInFlight; ++i) {
      core->calls().Run(
          Operation::kMaskedSoftmax, CallContext{},
          [](ElementBudget*) -> absl::StatusOr<CallRunner::Work> {
            return CallRunner::Work(
                []() -> absl::StatusOr<std::string> { return "none"; });
          },
          &responder);
    }
    responder.Wait();
  }
  if (responder.failures() > 0) state.SkipWithError("a request failed");
  state.SetItemsProcessed(state.iterations() * kInFlight);
}

// 32 requests of one class, on the calling thread: run one by one
// (together 0) or combined into one library call (together 1). What
// combining itself costs or buys, without the pool. args: operation (0
// masked softmax, 1 batch matmul, 2 attention), length, together.
void BM_Combine(benchmark::State& state) {
  const int op = static_cast<int>(state.range(0));
  const int64_t length = state.range(1);
  const bool together = state.range(2) != 0;
  attn::EngineOptions engine_options;
  engine_options.max_threads = 1;
  auto engine = attn::Engine::Create(engine_options).value();
  const auto x = Inputs({1, length, length}, 32), y = Inputs({1, length, length}, 32),
             z = Inputs({1, length, length}, 32);
  std::vector<OperationRequest> requests;
  for (int i = 0; i < 32; ++i) {
    if (op == 0) {
      requests.push_back(attn::MaskedSoftmaxRequest{x[i].view(), {}});
    } else if (op == 1) {
      requests.push_back(attn::BatchMatmulRequest{x[i].view(), y[i].view(), {}});
    } else {
      attn::AttentionRequest request;
      request.queries = x[i].view();
      request.keys = y[i].view();
      request.values = z[i].view();
      requests.push_back(request);
    }
  }
  std::vector<const OperationRequest*> pointers;
  for (const OperationRequest& request : requests) pointers.push_back(&request);
  for (auto _ : state) {
    if (together) {
      CombinedWork work;
      benchmark::DoNotOptimize(RunTogether(*engine, pointers, &work));
    } else {
      for (const OperationRequest* request : pointers) {
        benchmark::DoNotOptimize(RunAlone(*engine, *request));
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(BM_Combine)
    ->ArgNames({"op", "L", "together"})
    ->ArgsProduct({{0, 1, 2}, {64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

#define CORE_CASES(name, toy_length, toy_depth, medium_length, medium_depth) \
  BENCHMARK(name)                                                            \
      ->ArgNames({"L", "d", "batching"})                                     \
      ->Args({toy_length, toy_depth, 0})                                     \
      ->Args({toy_length, toy_depth, 1})                                     \
      ->Args({medium_length, medium_depth, 0})                               \
      ->Args({medium_length, medium_depth, 1})                               \
      ->UseRealTime()                                                        \
      ->Unit(benchmark::kMillisecond)

// Toy: the textbook's scale; medium: L 64, d 64 rows.
CORE_CASES(BM_CoreAttention, 10, 2, 64, 64);
CORE_CASES(BM_CoreMaskedSoftmax, 10, 0, 64, 0);
CORE_CASES(BM_CoreBatchMatmul, 10, 2, 64, 64);
CORE_CASES(BM_CoreAdditiveAttention, 10, 8, 64, 64);
// Nadaraya-Watson: L queries against d training points.
CORE_CASES(BM_CoreNadarayaWatson, 10, 50, 64, 1000);
BENCHMARK(BM_CoreEmptyCall)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnserve

// As the server runs with --batching (server/process/malloc_policy.h; one call
// at a time measured the same either way); ATTN_DEFAULT_MALLOC=1 keeps
// glibc's defaults for the cases without batching, to see what the policy
// buys (a core with batching always sets it, as the server does).
int main(int argc, char** argv) {
  const char* defaults = std::getenv("ATTN_DEFAULT_MALLOC");
  if (defaults == nullptr || std::string(defaults) != "1") {
    attnserve::KeepFreedMemoryForReuse();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
