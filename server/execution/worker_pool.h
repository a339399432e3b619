// A fixed set of threads that run the kernel work the RPC handlers hand on,
// behind a bounded queue, so that no gRPC thread ever blocks on a kernel.
//
// Thread-safe. Schedule never blocks. Shutdown blocks until every task that
// was accepted has run (a drained server loses no accepted request).
#ifndef ATTNSERVE_SERVER_EXECUTION_WORKER_POOL_H_
#define ATTNSERVE_SERVER_EXECUTION_WORKER_POOL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace attnserve {

class WorkerPool {
 public:
  struct Options {
    int threads = 2;        // >= 1
    int max_queue = 1024;   // tasks waiting for a thread; >= 1
  };

  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(
      const Options& options);

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();  // Shutdown()

  // Queues `task`. RESOURCE_EXHAUSTED when max_queue tasks are already
  // waiting (retryable: the queue drains at the kernels' pace); UNAVAILABLE
  // once Shutdown has begun. The task runs exactly once if OK is returned.
  // Queued tasks run by priority level, then in arrival order: level 1
  // first, then 2, ...; 0 (no priority given) after every explicit level
  // (Triton's request priority, with the default level the lowest).
  absl::Status Schedule(std::function<void()> task, uint64_t priority = 0);
  // What Schedule would answer now, without queueing anything: a caller
  // refuses work it has not yet prepared at once (a full server's refusals
  // then cost it little). Schedule still decides.
  absl::Status CheckRoom() const;

  // Tasks waiting for a thread now.
  int queue_depth() const;

  // Threads waiting for work beyond the tasks already queued for them: a
  // task scheduled now would start at once when this is positive.
  int available_threads() const;

  // Called on a worker thread, with no lock held, each time it finishes a
  // task and finds the queue empty: a batcher forms its next batch then.
  // Set before scheduling anything; not thread-safe against Schedule.
  void SetIdleCallback(std::function<void()> on_idle);

  // Refuses new tasks, runs the queued ones, joins the threads. Blocks
  // until they have run; idempotent, and safe to call from several threads
  // at once (each returns once the threads are joined). Never call it from
  // a task or the idle callback.
  void Shutdown();

 private:
  explicit WorkerPool(const Options& options);
  void Work();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  // Waiting tasks by level (priority 0 keyed as the largest level).
  std::map<uint64_t, std::deque<std::function<void()>>> queue_
      ABSL_GUARDED_BY(mu_);
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Threads free for a task: blocked in Await, or back from a task and
  // running the idle callback.
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_idle_;
  // Serialises Shutdown's joins (std::thread is not thread-safe).
  absl::Mutex join_mu_;
  std::vector<std::thread> threads_;  // started in Create, joined in Shutdown
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_WORKER_POOL_H_
