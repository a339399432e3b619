#include "server/execution/execution_stack.h"

#include <malloc.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "attn/status_macros.h"
#include "server/process/malloc_policy.h"

namespace attnserve {

absl::StatusOr<std::unique_ptr<ExecutionStack>> ExecutionStack::Create(
    const Options& options, std::unique_ptr<attn::Engine> engine,
    std::unique_ptr<attn::Engine> wide_engine) {
  if (engine == nullptr) {
    return absl::InvalidArgumentError("ExecutionStack::Create: no engine");
  }
  RETURN_IF_ERROR(Admission::Check(options.admission));
  std::unique_ptr<ExecutionStack> core(new ExecutionStack(options));
  core->engine_ = std::move(engine);
  core->wide_engine_ = std::move(wide_engine);
  ASSIGN_OR_RETURN(core->metrics_,
                   ServiceMetrics::Create(core->engine_->implementations()));
  ASSIGN_OR_RETURN(core->pool_, WorkerPool::Create(options.workers));
  ExecutionStack* raw = core.get();
  const std::optional<BatchingOptions>& batching =
      options.batching.has_value() ? options.batching : options.gainful_batching;
  if (batching.has_value()) {
    // A batch of every operation frees several large buffers at once: keep
    // them for the next. (Batches on a stored version stack queries alone:
    // small.)
    if (options.batching.has_value()) KeepFreedMemoryForReuse();
    ASSIGN_OR_RETURN(
        core->batcher_,
        Batcher::Create(
            *batching, core->engine_.get(),
            options.clock != nullptr ? options.clock : &core->real_clock_,
            [raw](std::function<void()> work, uint64_t priority) {
              return raw->pool_->Schedule(std::move(work), priority);
            },
            [raw](const BatchStats& stats) {
              raw->metrics_->BatchExecuted(stats.operation, stats.requests,
                                           stats.computed_elements,
                                           stats.useful_elements);
            },
            // A batch is handed on at once while a worker waits for work:
            // waiting for more requests would only idle it.
            [raw] { return raw->pool_->available_threads() > 0; },
            core->SharedPassEngine()));
    core->pool_->SetIdleCallback([raw] { raw->batcher_->OnExecutorIdle(); });
    core->batcher_->StartScheduler();
  }
  core->admission_ = std::make_unique<Admission>(options.admission);
  core->metrics_->SetQueueDepthSource([raw] { return raw->queue_depth(); });
  core->metrics_->SetInflightBytesSource(
      [raw] { return raw->admission_->inflight_bytes(); });
  core->metrics_->SetHeldMemorySource(
      [raw] { return raw->engine_->held_memory_stats(); });
  core->calls_ = std::make_unique<CallRunner>(
      core->engine_.get(), core->pool_.get(), core->batcher_.get(),
      core->metrics_.get(), options.limits, core->admission_.get(),
      /*batch_everything=*/options.batching.has_value());
  if (options.return_memory_when_idle) {
    core->memory_return_ =
        std::thread([raw] { raw->ReturnMemoryWhileRunning(); });
  }
  return core;
}

ExecutionStack::~ExecutionStack() { Shutdown(); }

int ExecutionStack::queue_depth() const {
  return pool_->queue_depth() +
         (batcher_ != nullptr ? batcher_->queue_depth() : 0);
}

void ExecutionStack::Shutdown() {
  if (batcher_ != nullptr) batcher_->Shutdown();
  if (pool_ != nullptr) pool_->Shutdown();
  if (memory_return_.joinable()) {
    if (!stop_memory_return_.HasBeenNotified()) stop_memory_return_.Notify();
    memory_return_.join();
  }
}

// glibc keeps freed memory in its arenas, so RSS would stay at a burst's
// peak (~1.2 GB after 256 calls of 2.6 MB in a trial) long after it ended;
// malloc_trim gives back every free page. It walks every arena
// (milliseconds), so it runs only with no call in flight, and only when the
// arenas hold 32 MiB more free memory than at their lowest since the last
// trim: whatever freed it, calls or gRPC's buffers for connections and
// streams that are gone (no call accounts for those: 7,000 idle
// connections opened and closed left 159 MiB of 31 before this).
void ExecutionStack::ReturnMemoryWhileRunning() {
  constexpr size_t kWorthTrimming = size_t{32} << 20;
  size_t lowest_free = mallinfo2().fordblks;
  while (!stop_memory_return_.WaitForNotificationWithTimeout(
      absl::Seconds(1))) {
    if (admission_->inflight_calls() != 0) continue;
    const size_t free_bytes = mallinfo2().fordblks;
    lowest_free = std::min(lowest_free, free_bytes);
    if (free_bytes >= lowest_free + kWorthTrimming) {
      malloc_trim(0);
      // Trimmed pages stay free chunks: count from here.
      lowest_free = free_bytes;
    }
  }
}

ExecutionStack::DrainReport ExecutionStack::Drain(
    absl::Duration notice, absl::Duration grace,
    const std::function<void()>& not_serving) {
  GiveDrainNotice();
  not_serving();
  absl::SleepFor(notice);
  // gRPC's own Server::Shutdown is not used: it cancels (as CANCELLED,
  // which no client retries) every call whose request is still arriving,
  // and a client cannot tell that from its own cancellation. So what
  // arrives from now on is refused with UNAVAILABLE (not started; retry
  // elsewhere), and the drain waits until every call accepted before has
  // been answered and its response sent (admission tickets are held until
  // gRPC is done with a call); the process then exits, and a call still in
  // transit sees its connection close: UNAVAILABLE too.
  DrainReport report;
  const absl::Time started = absl::Now();
  report.accepted = admission().inflight_calls();
  StartDraining();
  report.answered = WaitUntilIdle(started + grace);
  report.took = absl::Now() - started;
  report.unanswered = report.answered ? 0 : admission().inflight_calls();
  return report;
}

}  // namespace attnserve
