// The execution stack, assembled once: the one place that wires the clock, the
// worker pool, the batcher (with the production availability check, idle
// callback and observer), admission, metrics and the CallRunner together.
// The server process (server/main.cc), the in-process service tests, the
// core benchmark and the fuzz harness all build it through Create, so the
// configuration they test or measure is the one that serves.
//
// What it does not hold: the engine's construction (the caller picks its
// backends and warms them up, then hands the engine over), the models
// (server/models/, over the repository; the core knows no protocol and no
// model) and the front ends (server/typed/, server/kserve/), which borrow
// calls() and, where they need them, metrics(), admission() and ready().
//
// Thread-safe after Create: the accessors return objects that are
// themselves thread-safe. Shutdown (and the destructor) block until the
// scheduler and the workers have stopped; every front end must have
// stopped handing calls in before the core is destroyed.
#ifndef ATTNSERVE_SERVER_EXECUTION_EXECUTION_STACK_H_
#define ATTNSERVE_SERVER_EXECUTION_EXECUTION_STACK_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "attn/engine.h"
#include "server/execution/admission.h"
#include "server/execution/batcher.h"
#include "server/execution/call_runner.h"
#include "server/execution/clock.h"
#include "server/execution/metrics.h"
#include "server/execution/worker_pool.h"

namespace attnserve {

class ExecutionStack {
 public:
  struct Options {
    WorkerPool::Options workers;
    // Server-side batching of every batchable operation
    // (server/execution/batchable.h); nullopt: off. When on, the batcher's queue
    // bound is its max_queue_size, and freed blocks are kept for the next
    // batch (server/process/malloc_policy.h; process-wide).
    std::optional<BatchingOptions> batching;
    // When `batching` is off: batching of the calls that gain from it alone
    // (CallContext::gains_from_batching: calls on a stored version, which a
    // batch reads once for all), the others running alone; nullopt:
    // those run alone too. The server's default (--batch_stored_memories).
    std::optional<BatchingOptions> gainful_batching;
    Admission::Options admission;
    ServiceLimits limits;
    // Gives freed memory back to the system once a burst is over
    // (malloc_trim from a thread of the core's: see execution_stack.cc). The
    // server process turns it on; tests and benchmarks need not.
    bool return_memory_when_idle = false;
    // Not owned; must outlive the core. Null: the wall clock.
    const Clock* clock = nullptr;
  };

  // Takes `engine` and assembles the rest. INVALID_ARGUMENT naming the
  // option for options out of range (workers, admission, batching).
  // `wide_engine` (may be null): an engine whose calls may use every core,
  // on which the batcher runs the batches that share one pass over a stored
  // version one at a time (Batcher::Create). Where `engine` runs on a GPU,
  // it is that engine itself: such a batch spreads its keys over every SM,
  // so the next one gathers queries while it runs instead of competing
  // with it for the GPU.
  static absl::StatusOr<std::unique_ptr<ExecutionStack>> Create(
      const Options& options, std::unique_ptr<attn::Engine> engine,
      std::unique_ptr<attn::Engine> wide_engine = nullptr);

  ExecutionStack(const ExecutionStack&) = delete;
  ExecutionStack& operator=(const ExecutionStack&) = delete;
  ~ExecutionStack();  // Shutdown()

  CallRunner& calls() { return *calls_; }
  ServiceMetrics& metrics() { return *metrics_; }
  Admission& admission() { return *admission_; }
  attn::Engine& engine() { return *engine_; }
  // Requests waiting: for a worker, and for a batch when batching is on.
  int queue_depth() const;
  // The batcher's options when batching is on, else null.
  const BatchingOptions* batching() const {
    return options_.batching.has_value() ? &*options_.batching : nullptr;
  }

  // Readiness, as every front end reports it (KServe's ServerReady,
  // ModelReady, the repository index; REST's health/ready): true from Create
  // until GiveDrainNotice, which starts the drain notice: ready says no so
  // that load balancers stop sending, while calls are still served.
  void GiveDrainNotice() { ready_.store(false); }
  bool ready() const { return ready_.load(); }

  // The drain: from StartDraining on, new calls are answered UNAVAILABLE
  // before they are decoded; WaitUntilIdle blocks until every call accepted
  // before has been answered and its response released, or `deadline`
  // (false then).
  void StartDraining() { admission_->StartDraining(); }
  bool WaitUntilIdle(absl::Time deadline) {
    return admission_->WaitUntilIdle(deadline);
  }

  // The whole drain after a termination signal, blocking: the drain notice
  // (`not_serving` tells the transports' health checks) for `notice` while
  // calls are still served, then StartDraining and up to `grace` for the
  // calls accepted before to be answered. What it did, for the log.
  struct DrainReport {
    int64_t accepted = 0;    // calls in flight when the drain began
    bool answered = false;   // all of them answered within `grace`
    absl::Duration took;     // from StartDraining to the end
    int64_t unanswered = 0;  // still in flight when `grace` ran out
  };
  DrainReport Drain(absl::Duration notice, absl::Duration grace,
                    const std::function<void()>& not_serving);

  // Refuses new work (UNAVAILABLE), hands queued batches to the workers,
  // lets every accepted task run, then stops the threads. Blocks for that;
  // idempotent.
  void Shutdown();

 private:
  explicit ExecutionStack(const Options& options) : options_(options) {}
  void ReturnMemoryWhileRunning();

  const Options options_;
  std::atomic<bool> ready_{true};
  RealClock real_clock_;
  std::unique_ptr<attn::Engine> engine_;
  std::unique_ptr<attn::Engine> wide_engine_;  // may be null
  // The engine a stored version's shared-pass batches run on, one at a
  // time: wide_engine_, else the engine itself on a GPU, else none.
  attn::Engine* SharedPassEngine() const {
    if (wide_engine_ != nullptr) return wide_engine_.get();
    return engine_->device() == attn::Device::kCuda ? engine_.get() : nullptr;
  }
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<CallRunner> calls_;
  absl::Notification stop_memory_return_;
  std::thread memory_return_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_EXECUTION_STACK_H_
