// Server-side dynamic batching of every operation with a batch dimension,
// in the spirit of TF Serving's batching library and Triton's dynamic
// batcher.
//
// Requests are queued by class (server/execution/batchable.h says, per
// operation, what requests of one class share and how they are padded):
// requests of one class whose ragged extents differ are batched by padding,
// padded positions masked through per-row valid lengths (so they get
// exactly zero weight) and padded rows dropped from the results. Each
// request's result equals its result alone, to float rounding.
//
// The batcher is work-conserving: while an executor thread is free, queued
// requests are handed on at once (holding them would only add latency), and
// batches grow while every thread is busy: where the executor reports free
// threads, a batch that no thread could start waits here, growing, not in
// the executor's queue, until a thread frees up or it has waited kMaxHold
// (at most one of the batcher's batches waits there, so a wrong report
// cannot hold a request for good). Otherwise a class's batch
// is handed to the executor as soon as it is full (max_batch_requests, or
// max_batch_elements of input), or when its pending count reaches a
// preferred batch size, or when its oldest request has waited
// max_queue_delay. Call OnExecutorIdle whenever an executor thread frees up.
//
// Priorities (Triton's): within a class, requests of level 1 are taken
// first, then 2, ...; level 0 (none given) after every explicit level; FIFO
// within a level. A batch goes to the executor with the best level among
// its members, and batches due together are handed on best level first.
// Classes are looked at best level first, then oldest call first (never in
// key order), so when only one batch may run (a wide engine's), the class
// whose call has waited longest takes it, and a class waits behind at most
// one batch of each other. The queue bound (max_queue_size) counts every
// level.
//
// At run time, requests that were cancelled or whose deadline passed while
// queued are answered CANCELLED or DEADLINE_EXCEEDED and not computed.
// Shutdown hands every queued request on at once (the queues drain; no
// accepted request is lost).
//
// Time comes from an injected Clock. FormDueBatches() does all the forming;
// StartScheduler() runs it on a thread of its own, which waits (on the real
// time of the deadlines the clock reports) for a class to fall due or fill
// up. Tests drive FormDueBatches() by hand with a FakeClock instead.
//
// Thread-safe. Schedule never blocks. Each task's `done` runs exactly once,
// on an executor thread (or on the caller's thread when Schedule fails it
// is not called at all: the status is returned instead). The executor must
// run every closure it accepts (WorkerPool does, Shutdown included). A
// closure holds what it needs but the engine and the clock, which must
// outlive it; it may run after the batcher is gone.
#ifndef ATTNSERVE_SERVER_EXECUTION_BATCHER_H_
#define ATTNSERVE_SERVER_EXECUTION_BATCHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attn/engine.h"
#include "attn/ops.h"
#include "server/execution/batchable.h"
#include "server/execution/clock.h"

namespace attnserve {

struct BatchingOptions {
  // Requests in one batch; >= 1.
  int max_batch_requests = 32;
  // Input elements of one batch (its members' own, before padding); a
  // single request larger than this runs alone.
  int64_t max_batch_elements = int64_t{1} << 24;
  // How long the oldest request of a class may wait for company.
  absl::Duration max_queue_delay = absl::Microseconds(500);
  // Pending counts at which a batch is sent at once, without waiting out
  // the delay; each in [1, max_batch_requests]. Empty: only full batches and
  // the delay send.
  std::vector<int> preferred_batch_sizes;
  // Requests waiting in all classes together; beyond it Schedule answers
  // RESOURCE_EXHAUSTED (retryable).
  int max_queue_size = 1024;
};

// What one executed batch looked like, for metrics.
struct BatchStats {
  Operation operation = Operation::kScaledDotProductAttention;  // its operation
  int requests = 0;
  // Score-matrix (or output) elements of the padded batch, and of the
  // requests themselves; their difference is the padding.
  int64_t computed_elements = 0;
  int64_t useful_elements = 0;
};

// When a request's batch ran, for its latency metrics.
struct BatchTiming {
  absl::Time started;                       // the batch began to run
  absl::Duration kernel = absl::ZeroDuration();  // the batch's kernel time
  int batch_requests = 0;                   // requests computed together
};

class Batcher {
 public:
  using Done =
      std::function<void(absl::StatusOr<attn::OpResult>, const BatchTiming&)>;
  struct Task {
    // Views must stay valid until `done` has run.
    OperationRequest request;
    absl::Time deadline = absl::InfiniteFuture();
    // 1 first, then 2, ...; 0 (none) last.
    uint64_t priority = 0;
    std::function<bool()> cancelled;  // may be empty
    Done done;
  };
  // Runs a closure on a batch thread, in the order of `priority` (as for a
  // task); a non-OK status means it will not run.
  using Executor =
      std::function<absl::Status(std::function<void()>, uint64_t priority)>;
  // Called once per executed batch (on the executor's thread); may be empty.
  using BatchObserver = std::function<void(const BatchStats&)>;
  // Whether a closure handed to the executor now would start at once; may
  // be empty (never: batches wait for size or delay only).
  using ExecutorAvailable = std::function<bool()>;

  // The longest a due batch is held while the executor reports every thread
  // busy (past max_queue_delay, if that is longer): then it goes to the
  // executor's queue, should no idle report come.
  static constexpr absl::Duration kMaxHold = absl::Milliseconds(50);

  // INVALID_ARGUMENT for options out of range. `wide_engine` (may be null;
  // it must outlive the batcher's closures, as `engine`): an engine whose
  // calls may use every core. Batches of the classes whose work is one
  // shared pass (BatchClass::shares_a_pass: a stored version's) then run on
  // it one at a time, all such classes together, instead of one per worker.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(
      const BatchingOptions& options, attn::Engine* engine, const Clock* clock,
      Executor executor, BatchObserver observer = {},
      ExecutorAvailable executor_available = {},
      attn::Engine* wide_engine = nullptr);

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;
  ~Batcher();  // Shutdown()

  // Queues `task`. INVALID_ARGUMENT for a malformed request (checked here,
  // in the library's words, so one bad request never fails a batch), RESOURCE_EXHAUSTED when
  // max_queue_size requests wait (retryable), UNAVAILABLE after Shutdown.
  absl::Status Schedule(std::unique_ptr<Task> task);
  // What Schedule would answer now for a well-formed task, without queueing
  // anything: the caller refuses a request it has not decoded yet when the
  // queue is full (overload refusals then cost no decoding). Schedule
  // still decides.
  absl::Status CheckRoom() const;

  // Hands every batch that is due at the clock's now to the executor;
  // returns when the next class falls due (InfiniteFuture if none waits).
  // `from_scheduler`: the scheduler thread's own pass; any other pass that
  // leaves requests queued wakes the scheduler to wait for their due time.
  absl::Time FormDueBatches(bool from_scheduler = false);

  // An executor thread has freed up: hands on what is queued. Never blocks.
  void OnExecutorIdle() { FormDueBatches(); }

  // Starts the thread that calls FormDueBatches whenever a class may be due.
  void StartScheduler();

  // Refuses new tasks, hands every queued one on, stops the scheduler.
  // Tasks already handed to the executor finish there. When it returns,
  // every accepted task is in the executor's hands or answered, including
  // batches that another thread (Schedule, OnExecutorIdle) had taken off a
  // queue but not yet handed on. Blocks for that; idempotent, and safe to
  // call from several threads. Never call it from `done` or the executor.
  void Shutdown();

  int queue_depth() const;

 private:
  absl::Status RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Pending {
    std::unique_ptr<Task> task;
    absl::Time enqueued;
    int64_t elements;  // its own input elements
  };
  // One class's waiting requests, best level first, FIFO within a level.
  struct Queue {
    // Its batches run on the wide engine, one at a time (shares_a_pass).
    bool wide = false;
    std::deque<Pending> pending;
    int64_t elements = 0;  // the pending requests' elements
    // Arrival times of the pending requests: the oldest decides when the
    // class falls due, whatever its level.
    std::multiset<absl::Time> arrivals;
  };

  Batcher(const BatchingOptions& options, attn::Engine* engine,
          const Clock* clock, Executor executor, BatchObserver observer,
          ExecutorAvailable executor_available, attn::Engine* wide_engine);

  // Takes the tasks of the next batch off `queue` if one is due at `now`.
  std::vector<Pending> TakeDueBatch(Queue& queue, absl::Time now,
                                    int taken_this_pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a handed-on batch needs to run, shared by the executor's closures
  // so that they do not depend on the batcher's lifetime.
  struct Runner {
    attn::Engine* engine;
    attn::Engine* wide_engine;  // may be null
    const Clock* clock;
    BatchObserver observer;
  };
  // A batch taken off its queue, and whether it runs on the wide engine.
  struct DueBatch {
    std::vector<Pending> members;
    bool wide = false;
  };

  void Dispatch(DueBatch batch);
  // `wide_slot`: a wide batch's hold on the wide engine (null for others),
  // released once its kernel has run.
  static void RunBatch(const Runner& runner, std::vector<Pending>& batch,
                       std::atomic<int>* wide_slot);
  void SchedulerLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NothingInHand() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatchingOptions options_;
  const Clock* const clock_;
  const Executor executor_;
  const ExecutorAvailable executor_available_;
  const std::shared_ptr<const Runner> runner_;

  mutable absl::Mutex mu_;
  std::map<std::string, Queue> queues_ ABSL_GUARDED_BY(mu_);
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set by Schedule when a class may have become due, so that the scheduler
  // re-evaluates before its deadline.
  bool new_work_ ABSL_GUARDED_BY(mu_) = false;
  // Batches taken off the queues by FormDueBatches and not yet handed to
  // the executor (Shutdown waits for them).
  int in_hand_ ABSL_GUARDED_BY(mu_) = 0;
  // Batches handed to the executor that have not started yet; shared with
  // their closures, which may run after the batcher is gone.
  const std::shared_ptr<std::atomic<int>> waiting_to_start_ =
      std::make_shared<std::atomic<int>>(0);
  // Wide batches handed on whose kernel has not finished (at most one):
  // shared with their closures, as waiting_to_start_.
  const std::shared_ptr<std::atomic<int>> wide_running_ =
      std::make_shared<std::atomic<int>>(0);
  // Serialises StartScheduler and Shutdown (the std::thread is not
  // thread-safe). Taken before mu_, never while holding it.
  absl::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread scheduler_ ABSL_GUARDED_BY(lifecycle_mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_BATCHER_H_
