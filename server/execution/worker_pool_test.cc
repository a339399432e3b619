// The worker pool with real threads: every accepted task runs exactly once,
// Shutdown runs what is queued and refuses the rest, a full queue is
// refused, and the idle callback fires. Under ThreadSanitizer
// (tests/sanitizers/run_sanitizers.sh) these are the pool's race checks.
#include "server/execution/worker_pool.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(WorkerPoolTest, CreateRefusesBadOptions) {
  WorkerPool::Options options;
  options.threads = 0;
  EXPECT_EQ(WorkerPool::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.threads = 1;
  options.max_queue = 0;
  EXPECT_EQ(WorkerPool::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Several producers at once; each task writes its own slot, unlocked: the
// pool's hand-over must order the write before Shutdown returns.
TEST(WorkerPoolTest, EveryAcceptedTaskRunsExactlyOnce) {
  WorkerPool::Options options;
  options.threads = 3;
  options.max_queue = 4096;
  std::unique_ptr<WorkerPool> pool = WorkerPool::Create(options).value();
  constexpr int kProducers = 4, kTasksEach = 250;
  std::vector<int> runs(kProducers * kTasksEach, 0);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kTasksEach; ++i) {
        int* slot = &runs[p * kTasksEach + i];
        ASSERT_TRUE(pool->Schedule([slot] { ++*slot; }).ok());
      }
    });
  }
  for (std::thread& producer : producers) producer.join();
  pool->Shutdown();
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i], 1) << "task " << i;
  }
}

TEST(WorkerPoolTest, FullQueueIsRefusedAndShutdownRunsWhatWaits) {
  WorkerPool::Options options;
  options.threads = 1;
  options.max_queue = 2;
  std::unique_ptr<WorkerPool> pool = WorkerPool::Create(options).value();
  absl::Notification started, release;
  ASSERT_TRUE(pool->Schedule([&] {
                    started.Notify();
                    release.WaitForNotification();
                  })
                  .ok());
  started.WaitForNotification();  // the only thread is busy from here on
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool->Schedule([&] { ran.fetch_add(1); }).ok());
  ASSERT_TRUE(pool->Schedule([&] { ran.fetch_add(1); }).ok());
  EXPECT_EQ(pool->queue_depth(), 2);
  EXPECT_LE(pool->available_threads(), 0);
  const absl::Status full = pool->Schedule([&] { ran.fetch_add(100); });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("queue is full"), absl::string_view::npos);

  // Shutdown refuses new work at once and still runs the two queued tasks.
  // (The queue stays full until release: RESOURCE_EXHAUSTED until then.)
  std::thread stopper([&] { pool->Shutdown(); });
  absl::Status refused;
  while ((refused = pool->Schedule([&] { ran.fetch_add(100); })).code() ==
         absl::StatusCode::kResourceExhausted) {
    std::this_thread::yield();
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(pool->queue_depth(), 0);
}

TEST(WorkerPoolTest, QueuedTasksRunByPriorityThenArrival) {
  WorkerPool::Options options;
  options.threads = 1;
  std::unique_ptr<WorkerPool> pool = WorkerPool::Create(options).value();
  absl::Notification started, release;
  ASSERT_TRUE(pool->Schedule([&] {
                    started.Notify();
                    release.WaitForNotification();
                  })
                  .ok());
  started.WaitForNotification();
  absl::Mutex mu;
  std::vector<std::string> order;
  auto task = [&](std::string name) {
    return [&, name] {
      absl::MutexLock lock(&mu);
      order.push_back(name);
    };
  };
  // Queued while the one thread is busy: 1 first, then 2, 3; none last.
  ASSERT_TRUE(pool->Schedule(task("none-a"), 0).ok());
  ASSERT_TRUE(pool->Schedule(task("3"), 3).ok());
  ASSERT_TRUE(pool->Schedule(task("1-a"), 1).ok());
  ASSERT_TRUE(pool->Schedule(task("2"), 2).ok());
  ASSERT_TRUE(pool->Schedule(task("1-b"), 1).ok());
  ASSERT_TRUE(pool->Schedule(task("none-b")).ok());
  EXPECT_EQ(pool->queue_depth(), 6);
  release.Notify();
  pool->Shutdown();
  EXPECT_EQ(order, (std::vector<std::string>{"1-a", "1-b", "2", "3", "none-a",
                                             "none-b"}));
}

TEST(WorkerPoolTest, IdleCallbackRunsWhenTheQueueEmpties) {
  WorkerPool::Options options;
  options.threads = 2;
  std::unique_ptr<WorkerPool> pool = WorkerPool::Create(options).value();
  std::atomic<int> idle{0};
  pool->SetIdleCallback([&] { idle.fetch_add(1); });
  absl::BlockingCounter done(8);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(pool->Schedule([&] { done.DecrementCount(); }).ok());
  }
  done.Wait();
  pool->Shutdown();  // joins: every idle call has returned
  EXPECT_GE(idle.load(), 1);
  EXPECT_LE(idle.load(), 8);
}

// The idle callback runs on the thread that has just freed up, and that
// thread already counts as available: the batcher's "is a thread free to run
// a batch now?" (server/execution/execution_stack.h) asks from inside the callback.
// It did not count before: with one worker, a request the batcher held while
// the worker was busy stayed queued for max_queue_delay after the worker
// freed up (CallRunnerBatchingTest waited out its 30 s under load).
TEST(WorkerPoolTest, TheIdleThreadCountsAsAvailableInItsCallback) {
  WorkerPool::Options options;
  options.threads = 1;
  std::unique_ptr<WorkerPool> pool = WorkerPool::Create(options).value();
  std::atomic<int> available_in_callback{-1};
  absl::Notification called;
  pool->SetIdleCallback([&] {
    if (called.HasBeenNotified()) return;
    available_in_callback.store(pool->available_threads());
    called.Notify();
  });
  ASSERT_TRUE(pool->Schedule([] {}).ok());
  called.WaitForNotification();
  EXPECT_EQ(available_in_callback.load(), 1);
  // And a task scheduled from the callback still runs on that thread.
  absl::Notification ran;
  ASSERT_TRUE(pool->Schedule([&] { ran.Notify(); }).ok());
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

// Shutdown from several threads at once, then the destructor's: each call
// returns with the threads joined, and the queued work ran once.
TEST(WorkerPoolTest, ConcurrentShutdownsAreSafe) {
  WorkerPool::Options options;
  options.threads = 2;
  std::unique_ptr<WorkerPool> pool = WorkerPool::Create(options).value();
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(pool->Schedule([&] { ran.fetch_add(1); }).ok());
  }
  std::vector<std::thread> stoppers;
  for (int i = 0; i < 3; ++i) {
    stoppers.emplace_back([&] {
      pool->Shutdown();
      EXPECT_EQ(ran.load(), 50);  // returned only after the queue ran
    });
  }
  for (std::thread& stopper : stoppers) stopper.join();
  pool.reset();
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace attnserve
