// The batcher with a fake clock and an executor the test drives: batches
// form exactly when they should, expired and cancelled requests are never
// computed, and every request's result equals its result alone.
#include "server/execution/batcher.h"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "attn/engine.h"
#include "attn/reference.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "attn/work.h"
#include "server/execution/batchable.h"
#include "gtest/gtest.h"
#include "server/execution/worker_pool.h"

namespace attnserve {
namespace {

using ::attn::testing::AllExactly;
using ::attn::testing::RandomNormal;
using ::attn::testing::WithinBounds;

// One request with its own inputs and a slot for its answer.
struct Call {
  attn::Tensor q, k, v;
  std::vector<int32_t> lengths;
  attn::AttentionRequest request;
  std::optional<absl::StatusOr<attn::OpResult>> result;
};

std::unique_ptr<Call> MakeCall(std::mt19937& rng, int64_t batch, int64_t lq,
                               int64_t lk, int64_t d = 8, int64_t dv = 4,
                               int64_t heads = 0) {
  auto call = std::make_unique<Call>();
  auto shape = [&](int64_t length, int64_t depth) {
    return heads > 0 ? attn::Shape{batch, heads, length, depth}
                     : attn::Shape{batch, length, depth};
  };
  call->q = RandomNormal(rng, shape(lq, d));
  call->k = RandomNormal(rng, shape(lk, d));
  call->v = RandomNormal(rng, shape(lk, dv));
  call->request.queries = call->q.view();
  call->request.keys = call->k.view();
  call->request.values = call->v.view();
  return call;
}

class BatcherTest : public ::testing::Test {
 protected:
  void Make(BatchingOptions options) {
    engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
    batcher_ = Batcher::Create(
                   options, engine_.get(), &clock_,
                   [this](std::function<void()> work, uint64_t priority) {
                     executed_.push_back(std::move(work));
                     priorities_.push_back(priority);
                     return absl::OkStatus();
                   },
                   [this](const BatchStats& stats) { stats_.push_back(stats); })
                   .value();
  }

  absl::Status Schedule(Call* call, absl::Time deadline = absl::InfiniteFuture(),
                        std::function<bool()> cancelled = {},
                        uint64_t priority = 0) {
    auto task = std::make_unique<Batcher::Task>();
    task->request = call->request;
    task->deadline = deadline;
    task->cancelled = std::move(cancelled);
    task->priority = priority;
    task->done = [this, call](absl::StatusOr<attn::OpResult> result,
                              const BatchTiming&) {
      call->result = std::move(result);
      answered_.push_back(call);
    };
    return batcher_->Schedule(std::move(task));
  }

  // Runs the batches handed to the executor so far; returns how many.
  int RunExecuted() {
    std::vector<std::function<void()>> work;
    work.swap(executed_);
    for (auto& batch : work) batch();
    return static_cast<int>(work.size());
  }

  // Members are destroyed in reverse order: the batcher first, while what
  // it uses still exists. Its destructor shuts it down, which hands every
  // queued task to the executor, i.e. into executed_; those closures (and
  // the tasks they own) are then freed, unrun, with executed_. (Declared
  // before executed_, the batcher once pushed into a destroyed vector and
  // leaked them: LeakSanitizer's report.)
  FakeClock clock_;
  std::unique_ptr<attn::Engine> engine_;
  std::vector<std::function<void()>> executed_;
  std::vector<BatchStats> stats_;
  std::vector<uint64_t> priorities_;  // of each batch handed on, in order
  std::vector<Call*> answered_;       // calls in the order they were answered
  std::unique_ptr<Batcher> batcher_;
};

TEST_F(BatcherTest, FullBatchIsSentAtOnce) {
  BatchingOptions options;
  options.max_batch_requests = 4;
  options.max_queue_delay = absl::Milliseconds(10);
  Make(options);
  std::mt19937 rng(0);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(MakeCall(rng, 1, 3, 5));
    ASSERT_TRUE(Schedule(calls.back().get()).ok());
  }
  batcher_->FormDueBatches();  // no time has passed
  ASSERT_EQ(RunExecuted(), 1);
  ASSERT_EQ(stats_.size(), 1u);
  EXPECT_EQ(stats_[0].requests, 4);
  for (const auto& call : calls) ASSERT_TRUE(call->result.has_value());
  EXPECT_EQ(batcher_->queue_depth(), 0);
}

TEST_F(BatcherTest, PartialBatchIsSentWhenTheOldestHasWaitedTheDelay) {
  BatchingOptions options;
  options.max_batch_requests = 8;
  options.max_queue_delay = absl::Microseconds(500);
  Make(options);
  std::mt19937 rng(1);
  auto a = MakeCall(rng, 1, 3, 5), b = MakeCall(rng, 1, 3, 5);
  const absl::Time start = clock_.Now();
  ASSERT_TRUE(Schedule(a.get()).ok());
  clock_.Advance(absl::Microseconds(200));
  ASSERT_TRUE(Schedule(b.get()).ok());
  EXPECT_EQ(batcher_->FormDueBatches(), start + absl::Microseconds(500));
  EXPECT_EQ(RunExecuted(), 0);
  clock_.Advance(absl::Microseconds(299));
  batcher_->FormDueBatches();
  EXPECT_EQ(RunExecuted(), 0);
  clock_.Advance(absl::Microseconds(1));
  EXPECT_EQ(batcher_->FormDueBatches(), absl::InfiniteFuture());
  ASSERT_EQ(RunExecuted(), 1);
  EXPECT_EQ(stats_.at(0).requests, 2);
  EXPECT_TRUE(a->result.has_value() && a->result->ok());
  EXPECT_TRUE(b->result.has_value() && b->result->ok());
}

TEST_F(BatcherTest, PreferredSizeIsSentWithoutWaiting) {
  BatchingOptions options;
  options.max_batch_requests = 8;
  options.preferred_batch_sizes = {4};
  options.max_queue_delay = absl::Milliseconds(1);
  Make(options);
  std::mt19937 rng(2);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 5; ++i) {
    calls.push_back(MakeCall(rng, 1, 2, 2));
    ASSERT_TRUE(Schedule(calls.back().get()).ok());
  }
  // The fourth request made the class reach its preferred size: its batch
  // was handed on right then, without waiting for the delay.
  ASSERT_EQ(RunExecuted(), 1);
  EXPECT_EQ(stats_.at(0).requests, 4);
  EXPECT_EQ(batcher_->queue_depth(), 1);
  clock_.Advance(absl::Milliseconds(1));
  batcher_->FormDueBatches();
  ASSERT_EQ(RunExecuted(), 1);
  EXPECT_EQ(stats_.at(1).requests, 1);
}

TEST_F(BatcherTest, FullQueueIsRejectedAndInvalidRequestsNeverQueue) {
  BatchingOptions options;
  options.max_queue_size = 2;
  Make(options);
  std::mt19937 rng(3);
  auto a = MakeCall(rng, 1, 2, 2), b = MakeCall(rng, 1, 2, 2),
       c = MakeCall(rng, 1, 2, 2);
  ASSERT_TRUE(Schedule(a.get()).ok());
  ASSERT_TRUE(Schedule(b.get()).ok());
  const absl::Status full = Schedule(c.get());
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("queue is full"), absl::string_view::npos);

  auto bad = MakeCall(rng, 1, 2, 2);
  bad->request.keys.shape = {1, 2, 3};  // depth 3 against the queries' 8
  EXPECT_EQ(Schedule(bad.get()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batcher_->queue_depth(), 2);
}

TEST_F(BatcherTest, BetterPriorityLevelsAreTakenFirst) {
  BatchingOptions options;
  options.max_batch_requests = 16;
  // Each request: 1 x (4 x 8 + 4 x (8 + 4)) = 80 elements; two fit.
  options.max_batch_elements = 170;
  options.max_queue_delay = absl::Milliseconds(1);
  Make(options);
  std::mt19937 rng(12);
  auto none = MakeCall(rng, 1, 4, 4), second = MakeCall(rng, 1, 4, 4),
       first = MakeCall(rng, 1, 4, 4);
  ASSERT_TRUE(Schedule(none.get(), absl::InfiniteFuture(), {}, 0).ok());
  ASSERT_TRUE(Schedule(second.get(), absl::InfiniteFuture(), {}, 2).ok());
  // The third fills the element budget: a batch of the two best levels
  // goes at once, with the best level; the request without one waits.
  ASSERT_TRUE(Schedule(first.get(), absl::InfiniteFuture(), {}, 1).ok());
  ASSERT_EQ(RunExecuted(), 1);
  EXPECT_EQ(priorities_, std::vector<uint64_t>{1});
  EXPECT_EQ(answered_, (std::vector<Call*>{first.get(), second.get()}));
  EXPECT_EQ(batcher_->queue_depth(), 1);
  // It still goes when the oldest (itself) has waited the delay.
  clock_.Advance(absl::Milliseconds(1));
  batcher_->FormDueBatches();
  ASSERT_EQ(RunExecuted(), 1);
  EXPECT_EQ(answered_.back(), none.get());
  for (Call* call : answered_) EXPECT_TRUE(call->result->ok());
}

TEST_F(BatcherTest, BatchesDueTogetherGoBestLevelFirst) {
  BatchingOptions options;
  options.max_queue_delay = absl::Milliseconds(1);
  Make(options);
  std::mt19937 rng(13);
  // Three classes (depths 8, 16, 32), one request each, levels 0, 3, 2.
  auto a = MakeCall(rng, 1, 2, 2, 8), b = MakeCall(rng, 1, 2, 2, 16),
       c = MakeCall(rng, 1, 2, 2, 32);
  ASSERT_TRUE(Schedule(a.get(), absl::InfiniteFuture(), {}, 0).ok());
  ASSERT_TRUE(Schedule(b.get(), absl::InfiniteFuture(), {}, 3).ok());
  ASSERT_TRUE(Schedule(c.get(), absl::InfiniteFuture(), {}, 2).ok());
  clock_.Advance(absl::Milliseconds(1));
  batcher_->FormDueBatches();
  EXPECT_EQ(priorities_, (std::vector<uint64_t>{2, 3, 0}));
  ASSERT_EQ(RunExecuted(), 3);
  EXPECT_EQ(answered_, (std::vector<Call*>{c.get(), b.get(), a.get()}));
}

TEST_F(BatcherTest, EveryOperationBatchesInItsOwnClasses) {
  BatchingOptions options;
  options.max_queue_delay = absl::Milliseconds(1);
  Make(options);
  std::mt19937 rng(14);
  std::vector<attn::Tensor> inputs;
  std::vector<std::optional<absl::StatusOr<attn::OpResult>>> results(5);
  auto schedule = [&](OperationRequest request, int slot) {
    auto task = std::make_unique<Batcher::Task>();
    task->request = std::move(request);
    task->done = [&results, slot](absl::StatusOr<attn::OpResult> result,
                                  const BatchTiming&) {
      results[slot] = std::move(result);
    };
    return batcher_->Schedule(std::move(task));
  };
  inputs.reserve(8);
  for (int64_t rows : {3, 5}) {
    inputs.push_back(RandomNormal(rng, {2, rows, 6}));
  }
  ASSERT_TRUE(schedule(attn::MaskedSoftmaxRequest{inputs[0].view(), {}}, 0).ok());
  ASSERT_TRUE(schedule(attn::MaskedSoftmaxRequest{inputs[1].view(), {}}, 1).ok());
  inputs.push_back(RandomNormal(rng, {2, 6, 4}));
  inputs.push_back(RandomNormal(rng, {2, 6, 4}));
  ASSERT_TRUE(schedule(attn::BatchMatmulRequest{inputs[0].view(),
                                                inputs[2].view(), {}}, 2).ok());
  ASSERT_TRUE(schedule(attn::BatchMatmulRequest{inputs[1].view(),
                                                inputs[3].view(), {}}, 3).ok());
  // A matmul of another inner size: a class of its own.
  inputs.push_back(RandomNormal(rng, {2, 4, 4}));
  ASSERT_TRUE(schedule(attn::BatchMatmulRequest{inputs[2].view(),
                                                inputs[4].view(), {}}, 4).ok());
  EXPECT_EQ(batcher_->queue_depth(), 5);
  clock_.Advance(absl::Milliseconds(1));
  batcher_->FormDueBatches();
  ASSERT_EQ(RunExecuted(), 3);
  std::map<Operation, std::vector<int>> sizes;
  for (const BatchStats& stats : stats_) sizes[stats.operation].push_back(stats.requests);
  EXPECT_EQ(sizes[Operation::kMaskedSoftmax], std::vector<int>{2});
  EXPECT_EQ(sizes[Operation::kBatchMatmul].size(), 2u);
  for (const auto& result : results) {
    ASSERT_TRUE(result.has_value());
    EXPECT_TRUE(result->ok()) << result->status();
  }
  // Each answer has its request's own shape (the values are checked
  // against the reference in batchable_test.cc).
  EXPECT_EQ((*results[1])->output.shape, (attn::Shape{2, 5, 6}));
}

TEST_F(BatcherTest, ExpiredAndCancelledRequestsAreNotComputed) {
  BatchingOptions options;
  options.max_queue_delay = absl::Microseconds(500);
  Make(options);
  std::mt19937 rng(4);
  auto expired = MakeCall(rng, 1, 2, 3), cancelled = MakeCall(rng, 1, 2, 3);
  ASSERT_TRUE(
      Schedule(expired.get(), clock_.Now() + absl::Microseconds(100)).ok());
  ASSERT_TRUE(Schedule(cancelled.get(), absl::InfiniteFuture(),
                       [] { return true; })
                  .ok());
  clock_.Advance(absl::Microseconds(500));
  batcher_->FormDueBatches();
  ASSERT_EQ(RunExecuted(), 1);
  ASSERT_TRUE(expired->result.has_value());
  EXPECT_EQ(expired->result->status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(cancelled->result.has_value());
  EXPECT_EQ(cancelled->result->status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(stats_.empty());  // nothing reached the kernel
}

TEST_F(BatcherTest, ShutdownDrainsTheQueues) {
  BatchingOptions options;
  options.max_queue_delay = absl::Hours(1);
  Make(options);
  std::mt19937 rng(5);
  auto a = MakeCall(rng, 1, 2, 3), b = MakeCall(rng, 2, 4, 3, /*d=*/16);
  ASSERT_TRUE(Schedule(a.get()).ok());
  ASSERT_TRUE(Schedule(b.get()).ok());  // another class (d = 16)
  batcher_->Shutdown();
  EXPECT_EQ(RunExecuted(), 2);  // one batch per class
  EXPECT_TRUE(a->result.has_value() && a->result->ok());
  EXPECT_TRUE(b->result.has_value() && b->result->ok());
  auto late = MakeCall(rng, 1, 2, 3);
  EXPECT_EQ(Schedule(late.get()).code(), absl::StatusCode::kUnavailable);
}

// Ragged batching: requests of one class with different Lq, Lk and valid
// lengths are padded together; each result (output and weights) equals the
// request alone, and masked positions stay exactly zero.
struct RaggedCase {
  bool weights;
  bool causal;
  attn::ScoreKind score;
  int64_t heads;  // 0: the 3-D layout
};

class RaggedTest : public BatcherTest,
                   public ::testing::WithParamInterface<RaggedCase> {};

TEST_P(RaggedTest, EachResultEqualsTheRequestAlone) {
  const RaggedCase& c = GetParam();
  BatchingOptions options;
  options.max_batch_requests = 16;
  options.max_queue_delay = absl::Microseconds(100);
  Make(options);
  std::mt19937 rng(6);
  std::uniform_int_distribution<int64_t> length(1, 40);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 7; ++i) {
    const int64_t batch = 1 + i % 3, lq = length(rng), lk = length(rng);
    auto call = MakeCall(rng, batch, lq, lk, 16, 8, c.heads);
    call->request.return_weights = c.weights;
    call->request.causal = c.causal;
    call->request.score = c.score;
    if (i % 3 == 1) {  // (B,) lengths, including 0
      for (int64_t b = 0; b < batch; ++b) {
        call->lengths.push_back(static_cast<int32_t>(b == 0 ? 0 : lk / 2));
      }
      call->request.valid_lens = {call->lengths.data(), {batch}};
    } else if (i % 3 == 2) {  // (B, Q) lengths
      for (int64_t r = 0; r < batch * lq; ++r) {
        call->lengths.push_back(static_cast<int32_t>(r % (lk + 1)));
      }
      call->request.valid_lens = {call->lengths.data(), {batch, lq}};
    }
    ASSERT_TRUE(Schedule(call.get()).ok());
    calls.push_back(std::move(call));
  }
  clock_.Advance(absl::Microseconds(100));
  batcher_->FormDueBatches();
  ASSERT_EQ(RunExecuted(), 1);
  ASSERT_EQ(stats_.size(), 1u);
  EXPECT_EQ(stats_[0].requests, 7);
  EXPECT_GT(stats_[0].computed_elements, stats_[0].useful_elements);
  for (const auto& call : calls) {
    ASSERT_TRUE(call->result.has_value());
    ASSERT_TRUE(call->result->ok()) << call->result->status();
    const attn::OpResult alone =
        engine_->ScaledDotProductAttention(call->request).value();
    const attn::OpResult& batched = **call->result;
    // Batched, the kernels see other shapes (and may block and round
    // differently): the result keeps the same derived bound.
    attn::AttentionRequest with_weights = call->request;
    with_weights.return_weights = true;
    const attn::OpResult exact = attn::testing::ReferenceEngine()
                                     .ScaledDotProductAttention(with_weights)
                                     .value();
    const attn::testing::ErrorBounds bounds =
        attn::testing::AttentionBounds(with_weights, exact);
    EXPECT_TRUE(WithinBounds(batched.output, exact.output, bounds.output));
    if (c.weights) {
      EXPECT_TRUE(WithinBounds(batched.weights, exact.weights, bounds.weights));
      // Exactly zero where the request alone has exact zeros.
      for (size_t j = 0; j < alone.weights.data.size(); ++j) {
        if (alone.weights.data[j] == 0.0f) {
          ASSERT_TRUE(AllExactly(batched.weights, 0.0f, j, j + 1));
        }
      }
    } else {
      EXPECT_TRUE(batched.weights.empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, RaggedTest,
    ::testing::Values(RaggedCase{true, false, attn::ScoreKind::kDotProduct, 0},
                      RaggedCase{false, false, attn::ScoreKind::kDotProduct, 0},
                      RaggedCase{true, true, attn::ScoreKind::kDotProduct, 0},
                      RaggedCase{true, false, attn::ScoreKind::kGaussian, 0},
                      RaggedCase{true, true, attn::ScoreKind::kDotProduct, 3},
                      RaggedCase{false, false, attn::ScoreKind::kGaussian, 2}));

// Work-conserving: while the executor has a free thread, a request is handed
// on at once, without waiting for company or the delay.
TEST_F(BatcherTest, FreeExecutorThreadTakesRequestsAtOnce) {
  engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
  bool available = true;
  BatchingOptions options;
  options.max_queue_delay = absl::Hours(1);
  batcher_ = Batcher::Create(
                 options, engine_.get(), &clock_,
                 [this](std::function<void()> work, uint64_t) {
                   executed_.push_back(std::move(work));
                   return absl::OkStatus();
                 },
                 {}, [&available] { return available; })
                 .value();
  std::mt19937 rng(8);
  auto a = MakeCall(rng, 1, 2, 3), b = MakeCall(rng, 1, 2, 3),
       c = MakeCall(rng, 1, 2, 3);
  ASSERT_TRUE(Schedule(a.get()).ok());
  EXPECT_EQ(RunExecuted(), 1);  // a thread was free: sent alone, at once
  available = false;
  ASSERT_TRUE(Schedule(b.get()).ok());
  ASSERT_TRUE(Schedule(c.get()).ok());
  EXPECT_EQ(RunExecuted(), 0);  // every thread busy: they wait together
  available = true;
  batcher_->OnExecutorIdle();
  EXPECT_EQ(RunExecuted(), 1);  // b and c in one batch
  EXPECT_TRUE(b->result.has_value() && c->result.has_value());
  batcher_.reset();  // it calls back into `available`, a local of this test
}

// Past its delay, a batch that no thread could start is held while every
// thread is busy, growing, and goes on whole when one frees up; should no
// thread report free, it goes on after Batcher::kMaxHold. (Handed on at the
// delay, single-query calls on a stored memory ran in batches of ~15 with
// 64 in flight, not ~20.)
TEST_F(BatcherTest, DueBatchIsHeldWhileEveryThreadIsBusy) {
  engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
  bool available = false;
  BatchingOptions options;
  options.max_queue_delay = absl::Milliseconds(1);
  batcher_ = Batcher::Create(
                 options, engine_.get(), &clock_,
                 [this](std::function<void()> work, uint64_t) {
                   executed_.push_back(std::move(work));
                   return absl::OkStatus();
                 },
                 [this](const BatchStats& stats) { stats_.push_back(stats); },
                 [&available] { return available; })
                 .value();
  std::mt19937 rng(9);
  auto a = MakeCall(rng, 1, 2, 3), b = MakeCall(rng, 1, 2, 3),
       c = MakeCall(rng, 1, 2, 3), d = MakeCall(rng, 1, 2, 3);
  ASSERT_TRUE(Schedule(a.get()).ok());
  clock_.Advance(absl::Milliseconds(2));  // a is past its delay
  batcher_->FormDueBatches();
  EXPECT_EQ(RunExecuted(), 0);  // held: no thread could start it
  ASSERT_TRUE(Schedule(b.get()).ok());
  ASSERT_TRUE(Schedule(c.get()).ok());
  clock_.Advance(absl::Milliseconds(2));
  batcher_->FormDueBatches();
  EXPECT_EQ(RunExecuted(), 0);
  available = true;
  batcher_->OnExecutorIdle();
  ASSERT_EQ(RunExecuted(), 1);  // a, b and c in one batch
  EXPECT_EQ(stats_.at(0).requests, 3);
  available = false;
  ASSERT_TRUE(Schedule(d.get()).ok());
  clock_.Advance(Batcher::kMaxHold - absl::Microseconds(1));
  batcher_->FormDueBatches();
  EXPECT_EQ(RunExecuted(), 0);
  clock_.Advance(absl::Microseconds(1));
  batcher_->FormDueBatches();
  ASSERT_EQ(RunExecuted(), 1);  // the report never came: on it goes
  EXPECT_TRUE(d->result.has_value() && d->result->ok());
  batcher_.reset();  // it calls back into `available`, a local of this test
}

// What a batcher hands its executor, kept until a test runs it.
class HandedOn {
 public:
  Batcher::Executor executor() {
    return [this](std::function<void()> work, uint64_t) {
      absl::MutexLock lock(&mu_);
      work_.push_back(std::move(work));
      return absl::OkStatus();
    };
  }
  std::vector<std::function<void()>> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<std::function<void()>> work;
    work.swap(work_);
    return work;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
};

// However a test ends, a batch held on `thread` is released, the thread
// joined, and the batcher gone before the locals its closures use.
struct ReleaseOnExit {
  absl::Notification& release;
  std::thread& thread;
  std::unique_ptr<Batcher>& batcher;
  ~ReleaseOnExit() {
    if (!release.HasBeenNotified()) release.Notify();
    if (thread.joinable()) thread.join();
    batcher.reset();
  }
};

// The reference engine as a wide engine, so that a result says which
// engine computed it.
// The reference backend, spreading keys across threads where the CPU
// backend does: a wide engine whose results say which engine computed them.
class SpreadingReference final : public attn::Backend {
 public:
  std::string name() const override { return reference_.name(); }
  bool SpreadsKeysAcrossThreads(const attn::AttentionParams& p) const override {
    return p.lk >= 2 * attn::kMinKeysPerShare;
  }
  absl::StatusOr<const char*> MaskedSoftmax(const attn::MaskedSoftmaxParams& p) override {
    return reference_.MaskedSoftmax(p);
  }
  absl::StatusOr<const char*> BatchMatmul(const attn::BatchMatmulParams& p) override {
    return reference_.BatchMatmul(p);
  }
  absl::StatusOr<const char*> ScaledDotProductAttention(
      const attn::AttentionParams& p) override {
    return reference_.ScaledDotProductAttention(p);
  }
  absl::StatusOr<const char*> AdditiveAttention(
      const attn::AdditiveAttentionParams& p) override {
    return reference_.AdditiveAttention(p);
  }
  absl::StatusOr<const char*> NadarayaWatson(const attn::NadarayaWatsonParams& p) override {
    return reference_.NadarayaWatson(p);
  }

 private:
  attn::ReferenceBackend reference_;
};

std::unique_ptr<attn::Engine> ReferenceAsWideEngine() {
  std::vector<std::unique_ptr<attn::Backend>> backends;
  backends.push_back(std::make_unique<SpreadingReference>());
  return attn::Engine::CreateWithBackends(std::move(backends)).value();
}

// `request`, one batch entry of query rows, as a call on the stored version
// `version` (its result in the library's own shapes).
StoredRequest OnStoredVersion(const attn::AttentionRequest& request,
                              const void* version) {
  const attn::ResultSize size = attn::SizeOfResult(request).value();
  return StoredRequest{request, version, nullptr, size.output_shape,
                       size.weights_shape};
}

// With a wide engine, the batches of a stored memory's classes (their work
// one pass over a memory long enough to share out) run on it, one at a time
// across every such class, while other classes go on as before. The wide
// engine here is the reference engine, so that a result says which engine
// computed it; the first batch is held inside its run (the batch observer
// waits) while the others are scheduled.
TEST_F(BatcherTest, StoredMemoryBatchesRunOnTheWideEngineOneAtATime) {
  engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
  std::unique_ptr<attn::Engine> wide = ReferenceAsWideEngine();
  HandedOn handed_on;
  absl::Notification first_running, release_first;
  std::atomic<int> batches{0};
  batcher_ = Batcher::Create(
                 BatchingOptions{}, engine_.get(), &clock_,
                 handed_on.executor(),
                 [&](const BatchStats&) {
                   if (batches.fetch_add(1) == 0) {
                     first_running.Notify();
                     release_first.WaitForNotification();
                   }
                 },
                 /*executor_available=*/[] { return true; }, wide.get())
                 .value();
  std::mt19937 rng(12);
  // Two memories (told apart by identity, as stored versions are) and one
  // call that sends its own keys and values.
  const int first_memory = 0, second_memory = 0;
  // (Memories long enough to share out: attn::kMinKeysPerShare x 2 keys.)
  const int64_t keys = 2 * attn::kMinKeysPerShare;
  auto on_first = MakeCall(rng, 1, 1, keys),
       on_second = MakeCall(rng, 1, 1, keys), plain = MakeCall(rng, 1, 2, 3);
  auto schedule = [&](Call* call, const void* memory) {
    auto task = std::make_unique<Batcher::Task>();
    if (memory != nullptr) {
      task->request = OnStoredVersion(call->request, memory);
    } else {
      task->request = call->request;
    }
    task->done = [call](absl::StatusOr<attn::OpResult> result,
                        const BatchTiming&) { call->result = std::move(result); };
    return batcher_->Schedule(std::move(task));
  };
  ASSERT_TRUE(schedule(on_first.get(), &first_memory).ok());
  std::vector<std::function<void()>> first = handed_on.Take();
  ASSERT_EQ(first.size(), 1u);  // a thread is free: on at once
  std::thread runner(std::move(first.front()));
  ReleaseOnExit release_on_exit{release_first, runner, batcher_};
  first_running.WaitForNotification();
  ASSERT_TRUE(schedule(on_second.get(), &second_memory).ok());
  ASSERT_TRUE(schedule(plain.get(), nullptr).ok());
  // The plain call goes on; the other memory's batch waits for the first.
  std::vector<std::function<void()>> next = handed_on.Take();
  ASSERT_EQ(next.size(), 1u);
  next.front()();
  ASSERT_TRUE(plain->result.has_value() && plain->result->ok());
  EXPECT_EQ((*plain->result)->backend, "onednn-cpu");
  batcher_->OnExecutorIdle();
  EXPECT_TRUE(handed_on.Take().empty());
  release_first.Notify();
  runner.join();
  ASSERT_TRUE(on_first->result.has_value() && on_first->result->ok());
  EXPECT_EQ((*on_first->result)->implementation, "reference");
  batcher_->OnExecutorIdle();  // the worker that ran it frees up
  next = handed_on.Take();
  ASSERT_EQ(next.size(), 1u);
  next.front()();
  ASSERT_TRUE(on_second->result.has_value() && on_second->result->ok());
  EXPECT_EQ((*on_second->result)->implementation, "reference");
}

// The wide engine is free again once a batch's kernel is done: the next
// memory's batch goes on while the first one's answers are still going out.
TEST_F(BatcherTest, TheNextWideBatchStartsWhileTheLastOneAnswers) {
  engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
  std::unique_ptr<attn::Engine> wide = ReferenceAsWideEngine();
  HandedOn handed_on;
  batcher_ = Batcher::Create(
                 BatchingOptions{}, engine_.get(), &clock_,
                 handed_on.executor(),
                 {}, /*executor_available=*/[] { return true; }, wide.get())
                 .value();
  std::mt19937 rng(13);
  const int first_memory = 0, second_memory = 0;
  const int64_t keys = 2 * attn::kMinKeysPerShare;
  auto on_first = MakeCall(rng, 1, 1, keys), on_second = MakeCall(rng, 1, 1, keys);
  absl::Notification first_answering, release_first;
  auto first_task = std::make_unique<Batcher::Task>();
  first_task->request =
      OnStoredVersion(on_first->request, &first_memory);
  first_task->done = [&, call = on_first.get()](
                         absl::StatusOr<attn::OpResult> result,
                         const BatchTiming&) {
    call->result = std::move(result);
    first_answering.Notify();
    release_first.WaitForNotification();
  };
  ASSERT_TRUE(batcher_->Schedule(std::move(first_task)).ok());
  std::vector<std::function<void()>> first = handed_on.Take();
  ASSERT_EQ(first.size(), 1u);
  std::thread runner(std::move(first.front()));
  ReleaseOnExit release_on_exit{release_first, runner, batcher_};
  first_answering.WaitForNotification();
  auto second_task = std::make_unique<Batcher::Task>();
  second_task->request =
      OnStoredVersion(on_second->request, &second_memory);
  second_task->done = [call = on_second.get()](
                          absl::StatusOr<attn::OpResult> result,
                          const BatchTiming&) {
    call->result = std::move(result);
  };
  ASSERT_TRUE(batcher_->Schedule(std::move(second_task)).ok());
  // Handed on while the first batch is still answering.
  std::vector<std::function<void()>> next = handed_on.Take();
  ASSERT_EQ(next.size(), 1u);
  next.front()();
  ASSERT_TRUE(on_second->result.has_value() && on_second->result->ok());
  EXPECT_EQ((*on_second->result)->implementation, "reference");
  release_first.Notify();
  runner.join();
  ASSERT_TRUE(on_first->result.has_value() && on_first->result->ok());
}

// Two stored versions due at once, with one wide engine: the one whose call
// came first takes it first, whichever class key sorts first (the keys hold
// the versions' addresses, which say nothing about who has waited); the
// other goes next, behind one batch.
TEST_F(BatcherTest, DueWideBatchesGoOldestCallFirstWhateverTheirKeys) {
  engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
  std::unique_ptr<attn::Engine> wide = ReferenceAsWideEngine();
  HandedOn handed_on;
  std::atomic<bool> threads_free{false};
  batcher_ = Batcher::Create(
                 BatchingOptions{}, engine_.get(), &clock_,
                 handed_on.executor(), {},
                 /*executor_available=*/[&] { return threads_free.load(); },
                 wide.get())
                 .value();
  std::mt19937 rng(14);
  const int64_t keys = 2 * attn::kMinKeysPerShare;
  const int versions[2] = {0, 0};
  std::unique_ptr<Call> calls[2] = {MakeCall(rng, 1, 1, keys),
                                    MakeCall(rng, 1, 1, keys)};
  auto request = [&](int i) {
    return OnStoredVersion(calls[i]->request, &versions[i]);
  };
  const int sorts_first =
      ClassifyForBatching(request(0), wide.get())->key <
              ClassifyForBatching(request(1), wide.get())->key
          ? 0
          : 1;
  const int older = 1 - sorts_first;
  auto schedule = [&](int i) {
    auto task = std::make_unique<Batcher::Task>();
    task->request = request(i);
    task->done = [call = calls[i].get()](absl::StatusOr<attn::OpResult> result,
                                         const BatchTiming&) {
      call->result = std::move(result);
    };
    return batcher_->Schedule(std::move(task));
  };
  // Every thread busy: both calls are held, the older one first.
  ASSERT_TRUE(schedule(older).ok());
  clock_.Advance(absl::Microseconds(1));
  ASSERT_TRUE(schedule(sorts_first).ok());
  EXPECT_TRUE(handed_on.Take().empty());
  threads_free = true;
  batcher_->OnExecutorIdle();
  std::vector<std::function<void()>> next = handed_on.Take();
  ASSERT_EQ(next.size(), 1u);  // one wide batch at a time
  next.front()();
  EXPECT_TRUE(calls[older]->result.has_value());
  EXPECT_FALSE(calls[sorts_first]->result.has_value());
  batcher_->OnExecutorIdle();
  next = handed_on.Take();
  ASSERT_EQ(next.size(), 1u);
  next.front()();
  ASSERT_TRUE(calls[sorts_first]->result.has_value());
  EXPECT_TRUE(calls[sorts_first]->result->ok());
  EXPECT_TRUE(calls[older]->result->ok());
}

// The destructor shuts down: what still waits is handed to the executor,
// not dropped.
TEST_F(BatcherTest, DestroyingTheBatcherHandsQueuedTasksOn) {
  BatchingOptions options;
  options.max_queue_delay = absl::Hours(1);
  Make(options);
  std::mt19937 rng(9);
  auto a = MakeCall(rng, 1, 2, 3), b = MakeCall(rng, 1, 2, 3);
  ASSERT_TRUE(Schedule(a.get()).ok());
  ASSERT_TRUE(Schedule(b.get()).ok());
  EXPECT_EQ(RunExecuted(), 0);
  batcher_.reset();
  // One batch of both; its closure runs without the batcher.
  EXPECT_EQ(RunExecuted(), 1);
  EXPECT_TRUE(a->result.has_value() && a->result->ok());
  EXPECT_TRUE(b->result.has_value() && b->result->ok());
}

TEST_F(BatcherTest, ElementBudgetSplitsBatches) {
  BatchingOptions options;
  options.max_batch_requests = 16;
  // Each request: 1 x (4 x 8 + 4 x (8 + 4)) = 80 elements; two fit.
  options.max_batch_elements = 170;
  Make(options);
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 5; ++i) {
    calls.push_back(MakeCall(rng, 1, 4, 4));
    ASSERT_TRUE(Schedule(calls.back().get()).ok());
  }
  batcher_->FormDueBatches();
  EXPECT_EQ(RunExecuted(), 2);  // two full batches of 2; one request waits
  EXPECT_EQ(batcher_->queue_depth(), 1);
}

// Real threads: the executor is a WorkerPool, the scheduler thread waits on
// the real clock, and clients schedule from several threads at once, as in
// the server (server/main.cc wires them the same way). Under
// ThreadSanitizer (tests/sanitizers/run_sanitizers.sh) these are the
// batcher's and the pool's race checks; their inputs are small so that
// they stay quick there.
class BatcherThreadsTest : public ::testing::Test {
 protected:
  void Start(const BatchingOptions& options, int workers) {
    engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
    WorkerPool::Options pool_options;
    pool_options.threads = workers;
    pool_options.max_queue = 4096;  // never full here
    pool_ = WorkerPool::Create(pool_options).value();
    batcher_ = Batcher::Create(
                   options, engine_.get(), &clock_,
                   [pool = pool_.get()](std::function<void()> work,
                         uint64_t priority) {
                     return pool->Schedule(std::move(work), priority);
                   },
                   [this](const BatchStats& stats) {
                     computed_.fetch_add(stats.requests);
                   },
                   [pool = pool_.get()] { return pool->available_threads() > 0; })
                   .value();
    pool_->SetIdleCallback([batcher = batcher_.get()] {
      batcher->OnExecutorIdle();
    });
    batcher_->StartScheduler();
  }

  // The server's order: the batcher hands its queues on, then the pool
  // runs what it holds and joins its threads.
  void Stop() {
    batcher_->Shutdown();
    pool_->Shutdown();
  }

  void TearDown() override {
    if (batcher_ != nullptr) Stop();
  }

  // A task whose `done` stores the result in `call`, then calls `after`.
  static std::unique_ptr<Batcher::Task> TaskFor(
      Call* call, std::function<void()> after) {
    auto task = std::make_unique<Batcher::Task>();
    task->request = call->request;
    task->done = [call, after = std::move(after)](
                     absl::StatusOr<attn::OpResult> result, const BatchTiming&) {
      call->result = std::move(result);
      after();
    };
    return task;
  }

  RealClock clock_;
  std::unique_ptr<attn::Engine> engine_;
  std::atomic<int> computed_{0};
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<Batcher> batcher_;  // uses the pool: after it
};

// A pass on another thread (a worker's idle callback) that finds no free
// thread leaves the request queued; the scheduler must still send it when its
// delay runs out. (Such a pass used to consume the scheduler's wake-up: the
// request then waited for the next arrival, forever if none came.)
TEST_F(BatcherThreadsTest, AnIdlePassNeverSwallowsTheSchedulersWakeUp) {
  BatchingOptions options;
  options.max_queue_delay = absl::Milliseconds(2);
  engine_ = attn::Engine::Create(attn::EngineOptions{}).value();
  pool_ = WorkerPool::Create(WorkerPool::Options{}).value();
  batcher_ = Batcher::Create(
                 options, engine_.get(), &clock_,
                 [pool = pool_.get()](std::function<void()> work,
                       uint64_t priority) {
                   return pool->Schedule(std::move(work), priority);
                 },
                 {}, /*executor_available=*/[] { return false; })
                 .value();
  std::mt19937 rng(5);
  std::unique_ptr<Call> call = MakeCall(rng, 1, 3, 4);
  absl::Notification answered;
  ASSERT_TRUE(
      batcher_->Schedule(TaskFor(call.get(), [&] { answered.Notify(); })).ok());
  batcher_->OnExecutorIdle();  // not due, no free thread: stays queued
  batcher_->StartScheduler();  // must still wake for it
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(call->result.has_value());
  EXPECT_TRUE(call->result->ok()) << call->result->status();
}

// Four clients, two request classes, ragged shapes: every request is
// answered exactly once, with its own result.
TEST_F(BatcherThreadsTest, ConcurrentClientsEachGetTheirOwnResult) {
  BatchingOptions options;
  options.max_batch_requests = 8;
  options.preferred_batch_sizes = {4};
  options.max_queue_delay = absl::Microseconds(200);
  Start(options, /*workers=*/2);
  constexpr int kClients = 4, kCallsEach = 16;
  std::mt19937 rng(10);
  std::vector<std::vector<std::unique_ptr<Call>>> calls(kClients);
  for (int c = 0; c < kClients; ++c) {
    for (int i = 0; i < kCallsEach; ++i) {
      calls[c].push_back(MakeCall(rng, 1 + i % 2, 1 + (3 * i + c) % 9,
                                  1 + (5 * i + c) % 11, 8, 4,
                                  /*heads=*/i % 3 == 0 ? 2 : 0));
    }
  }
  absl::BlockingCounter answered(kClients * kCallsEach);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (const auto& call : calls[c]) {
        const absl::Status status = batcher_->Schedule(
            TaskFor(call.get(), [&answered] { answered.DecrementCount(); }));
        if (!status.ok()) {
          ADD_FAILURE() << status;
          answered.DecrementCount();
        }
      }
    });
  }
  for (std::thread& client : clients) client.join();
  answered.Wait();
  EXPECT_EQ(computed_.load(), kClients * kCallsEach);
  for (const auto& client_calls : calls) {
    for (const auto& call : client_calls) {
      ASSERT_TRUE(call->result.has_value());
      ASSERT_TRUE(call->result->ok()) << call->result->status();
      attn::AttentionRequest with_weights = call->request;
      with_weights.return_weights = true;
      const attn::OpResult exact = attn::testing::ReferenceEngine()
                                       .ScaledDotProductAttention(with_weights)
                                       .value();
      const attn::testing::ErrorBounds bounds =
          attn::testing::AttentionBounds(with_weights, exact);
      EXPECT_TRUE(
          WithinBounds((*call->result)->output, exact.output, bounds.output));
    }
  }
}

// Shutdown while clients are still scheduling: a request is either refused
// (UNAVAILABLE, and `done` never runs) or accepted and then computed; none
// is lost, none is answered twice.
TEST_F(BatcherThreadsTest, ShutdownUnderLoadLosesNoAcceptedRequest) {
  BatchingOptions options;
  options.max_batch_requests = 4;
  options.max_queue_delay = absl::Microseconds(100);
  constexpr int kClients = 3, kMaxCallsEach = 400;
  options.max_queue_size = kClients * kMaxCallsEach;  // never full here
  Start(options, /*workers=*/2);
  std::mt19937 rng(11);
  // One input per client, shared read-only by all of its requests.
  std::vector<std::unique_ptr<Call>> inputs;
  for (int c = 0; c < kClients; ++c) inputs.push_back(MakeCall(rng, 1, 4, 6));
  std::vector<std::atomic<int>> answers(kClients * kMaxCallsEach);
  std::vector<std::atomic<int>> ok_answers(kClients * kMaxCallsEach);
  std::vector<char> accepted(kClients * kMaxCallsEach, 0);  // one writer each
  std::atomic<int> accepted_count{0};
  absl::Notification enough;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kMaxCallsEach; ++i) {
        const int id = c * kMaxCallsEach + i;
        auto task = std::make_unique<Batcher::Task>();
        task->request = inputs[c]->request;
        task->done = [&answers, &ok_answers, id](
                         absl::StatusOr<attn::OpResult> result,
                         const BatchTiming&) {
          if (result.ok()) ok_answers[id].fetch_add(1);
          answers[id].fetch_add(1);
        };
        const absl::Status status = batcher_->Schedule(std::move(task));
        if (status.ok()) {
          accepted[id] = 1;
          if (accepted_count.fetch_add(1) + 1 == 24) enough.Notify();
        } else if (status.code() == absl::StatusCode::kUnavailable) {
          return;  // shutting down: this client is done
        } else {
          ADD_FAILURE() << status;
        }
      }
    });
  }
  // Shut down with requests in every stage: queued, handed on, running.
  enough.WaitForNotification();
  Stop();
  for (std::thread& client : clients) client.join();
  ASSERT_GE(accepted_count.load(), 24);
  for (int id = 0; id < kClients * kMaxCallsEach; ++id) {
    EXPECT_EQ(answers[id].load(), accepted[id] ? 1 : 0) << "request " << id;
    EXPECT_EQ(ok_answers[id].load(), accepted[id] ? 1 : 0) << "request " << id;
  }
  EXPECT_EQ(computed_.load(), accepted_count.load());
}

}  // namespace
}  // namespace attnserve
