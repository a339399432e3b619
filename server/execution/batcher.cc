#include "server/execution/batcher.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attnserve {
namespace {

// Levels in serving order: 1, 2, ..., then 0 (none given) last.
uint64_t Rank(uint64_t priority) {
  return priority == 0 ? UINT64_MAX : priority;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(
    const BatchingOptions& options, attn::Engine* engine, const Clock* clock,
    Executor executor, BatchObserver observer,
    ExecutorAvailable executor_available, attn::Engine* wide_engine) {
  if (options.max_batch_requests < 1 || options.max_batch_elements < 1 ||
      options.max_queue_size < 1 || options.max_queue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "batching: max_batch_requests, max_batch_elements and max_queue_size "
        "must be at least 1 and max_queue_delay not negative");
  }
  for (int size : options.preferred_batch_sizes) {
    if (size < 1 || size > options.max_batch_requests) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batching: preferred batch size ", size, " is outside [1, ",
          options.max_batch_requests, "] (max_batch_requests)"));
    }
  }
  if (engine == nullptr || clock == nullptr || !executor) {
    return absl::InvalidArgumentError(
        "batching: engine, clock and executor are required");
  }
  return std::unique_ptr<Batcher>(new Batcher(
      options, engine, clock, std::move(executor), std::move(observer),
      std::move(executor_available), wide_engine));
}

Batcher::Batcher(const BatchingOptions& options, attn::Engine* engine,
                 const Clock* clock, Executor executor, BatchObserver observer,
                 ExecutorAvailable executor_available,
                 attn::Engine* wide_engine)
    : options_(options),
      clock_(clock),
      executor_(std::move(executor)),
      executor_available_(std::move(executor_available)),
      runner_(std::make_shared<const Runner>(
          Runner{engine, wide_engine, clock, std::move(observer)})) {}

Batcher::~Batcher() { Shutdown(); }

absl::Status Batcher::Schedule(std::unique_ptr<Task> task) {
  absl::StatusOr<BatchClass> batch_class =
      ClassifyForBatching(task->request, runner_->wide_engine);
  if (!batch_class.ok()) return batch_class.status();
  const int64_t elements = batch_class->elements;
  const absl::Time now = clock_->Now();
  bool due_now = false;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(RoomLocked());
    Queue& queue = queues_[std::move(batch_class->key)];
    queue.wide = batch_class->shares_a_pass;
    // After every request of the same or a better level.
    const uint64_t rank = Rank(task->priority);
    auto position = std::find_if(
        queue.pending.begin(), queue.pending.end(), [rank](const Pending& p) {
          return Rank(p.task->priority) > rank;
        });
    queue.pending.insert(position, Pending{std::move(task), now, elements});
    queue.arrivals.insert(now);
    queue.elements += elements;
    ++queued_;
    const int count = static_cast<int>(queue.pending.size());
    due_now = count >= options_.max_batch_requests ||
              queue.elements >= options_.max_batch_elements ||
              std::find(options_.preferred_batch_sizes.begin(),
                        options_.preferred_batch_sizes.end(),
                        count) != options_.preferred_batch_sizes.end() ||
              (executor_available_ && waiting_to_start_->load() == 0 &&
               executor_available_());
    // Otherwise wake the scheduler only for a class's first request (a new
    // deadline); waking it on every arrival would cost a context switch each.
    if (!due_now && count == 1) new_work_ = true;
  }
  // A due batch is formed here rather than after a hop to the scheduler.
  if (due_now) FormDueBatches();
  return absl::OkStatus();
}

absl::Status Batcher::RoomLocked() const {
  if (stopping_) {
    return absl::UnavailableError("the server is shutting down");
  }
  if (queued_ >= options_.max_queue_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the batching queue is full (", options_.max_queue_size,
        " requests waiting, --max_queue); retry later"));
  }
  return absl::OkStatus();
}

absl::Status Batcher::CheckRoom() const {
  absl::MutexLock lock(&mu_);
  return RoomLocked();
}

int Batcher::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

std::vector<Batcher::Pending> Batcher::TakeDueBatch(Queue& queue,
                                                    absl::Time now,
                                                    int taken_this_pass) {
  std::vector<Pending> batch;
  const int count = static_cast<int>(queue.pending.size());
  if (count == 0) return batch;
  // One wide batch at a time: it uses every core. The next waits, growing,
  // until the running one's kernel is done (then the next arrival, its
  // worker's idle report, or the scheduler's next look hands it on).
  if (queue.wide && !stopping_ && wide_running_->load() > 0) return batch;
  // How many of the oldest fit the element budget (at least one).
  int fit = 0;
  int64_t elements = 0;
  for (const Pending& pending : queue.pending) {
    if (fit == options_.max_batch_requests) break;
    if (fit > 0 && elements + pending.elements > options_.max_batch_elements) {
      break;
    }
    elements += pending.elements;
    ++fit;
  }
  int take = 0;
  // A batch handed on while no thread can start it waits in the executor's
  // queue at the size it had; held here instead, it grows until a thread
  // frees up (OnExecutorIdle). So, where the executor reports free threads,
  // a batch goes on when one is free and none of ours is already waiting for
  // it. Past max_queue_delay it is held on while every thread is busy, up to
  // kMaxHold (so that a wrong report never holds a request for good), and
  // then goes on only while none of ours is waiting. Handing every due
  // batch on kept batches of single-query calls on a stored version at ~4
  // requests with 64 in flight, and handing one on at max_queue_delay kept
  // them at ~15 (bench/memory_batching_bench.sh).
  const int waiting = waiting_to_start_->load() + taken_this_pass;
  const bool executor_known = static_cast<bool>(executor_available_);
  const bool executor_free =
      executor_known && waiting == 0 && executor_available_();
  const absl::Duration oldest_waited = now - *queue.arrivals.begin();
  const bool waited = oldest_waited >= options_.max_queue_delay;
  const bool held_enough =
      oldest_waited >= std::max(options_.max_queue_delay, kMaxHold);
  if (fit < count || count >= options_.max_batch_requests) {
    take = fit;  // full
  } else if (stopping_ || executor_free ||
             (waited && (!executor_known || (waiting == 0 && held_enough)))) {
    take = fit;  // a thread is free to run it now, or it waited long enough
  } else {
    for (int size : options_.preferred_batch_sizes) {
      if (size <= count && size > take) take = size;
    }
  }
  for (int i = 0; i < take; ++i) {
    Pending& front = queue.pending.front();
    queue.elements -= front.elements;
    queue.arrivals.erase(queue.arrivals.find(front.enqueued));
    batch.push_back(std::move(front));
    queue.pending.pop_front();
  }
  queued_ -= take;
  if (take > 0 && queue.wide) wide_running_->fetch_add(1);
  return batch;
}

absl::Time Batcher::FormDueBatches(bool from_scheduler) {
  std::vector<DueBatch> due;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    // Only the scheduler consumes the wake-up: it is the one that waits
    // for `next`. A pass on another thread (Schedule, OnExecutorIdle) that
    // leaves requests queued wakes it below, so that it waits for their
    // due time; clearing the flag here instead lost that wake-up, and
    // requests left queued at the end of a burst waited for the next
    // arrival, forever if none came (found by bench/core_benchmark.cc).
    if (from_scheduler) new_work_ = false;
    const absl::Time now = clock_->Now();
    // Classes are served best level first, then oldest call first, never in
    // key order: one wide batch runs at a time, so the first class looked at
    // takes the slot, and a class key (a stored version's address) says
    // nothing about who has waited longest.
    std::vector<std::map<std::string, Queue>::iterator> order;
    order.reserve(queues_.size());
    for (auto it = queues_.begin(); it != queues_.end(); ++it) {
      order.push_back(it);
    }
    auto turn = [](const Queue& queue) {
      if (queue.pending.empty()) {
        return std::make_pair(std::numeric_limits<uint64_t>::max(),
                              absl::InfiniteFuture());
      }
      return std::make_pair(Rank(queue.pending.front().task->priority),
                            *queue.arrivals.begin());
    };
    std::sort(order.begin(), order.end(), [&turn](const auto& a, const auto& b) {
      return turn(a->second) < turn(b->second);
    });
    for (const auto& it : order) {
      Queue& queue = it->second;
      for (std::vector<Pending> batch =
               TakeDueBatch(queue, now, static_cast<int>(due.size()));
           !batch.empty();
           batch = TakeDueBatch(queue, now, static_cast<int>(due.size()))) {
        due.push_back(DueBatch{std::move(batch), queue.wide});
      }
      if (queue.pending.empty()) {
        queues_.erase(it);
      } else {
        // Held past its delay (threads busy): look again a delay from now,
        // if no thread frees up before.
        absl::Time due_at = *queue.arrivals.begin() + options_.max_queue_delay;
        if (due_at <= now) due_at = now + options_.max_queue_delay;
        next = std::min(next, due_at);
      }
    }
    if (!from_scheduler && next != absl::InfiniteFuture()) new_work_ = true;
    in_hand_ += static_cast<int>(due.size());
  }
  if (due.empty()) return next;
  // Best level first (each batch's first member holds its best level).
  std::stable_sort(due.begin(), due.end(),
                   [](const DueBatch& a, const DueBatch& b) {
                     return Rank(a.members.front().task->priority) <
                            Rank(b.members.front().task->priority);
                   });
  for (DueBatch& batch : due) Dispatch(std::move(batch));
  absl::MutexLock lock(&mu_);
  in_hand_ -= static_cast<int>(due.size());
  return next;
}

void Batcher::Dispatch(DueBatch batch) {
  const uint64_t priority = batch.members.front().task->priority;
  const bool wide = batch.wide;
  auto shared = std::make_shared<std::vector<Pending>>(std::move(batch.members));
  waiting_to_start_->fetch_add(1);
  const absl::Status status = executor_(
      [runner = runner_, shared, wide, waiting = waiting_to_start_,
       wide_running = wide_running_] {
        waiting->fetch_sub(1);
        // Released before the worker's idle report, which looks for the
        // next one.
        RunBatch(*runner, *shared, wide ? wide_running.get() : nullptr);
      },
      priority);
  if (!status.ok()) {
    waiting_to_start_->fetch_sub(1);
    if (wide) wide_running_->fetch_sub(1);
    for (Pending& pending : *shared) {
      pending.task->done(status, BatchTiming{clock_->Now()});
    }
  }
}

void Batcher::RunBatch(const Runner& runner, std::vector<Pending>& batch,
                       std::atomic<int>* wide_slot) {
  // Requests that expired or were cancelled while queued are not computed.
  const absl::Time now = runner.clock->Now();
  BatchTiming timing{now};
  std::vector<Task*> live;
  for (Pending& pending : batch) {
    Task& task = *pending.task;
    if (task.cancelled && task.cancelled()) {
      task.done(absl::CancelledError("the call was cancelled while queued"),
                timing);
    } else if (task.deadline <= now) {
      task.done(absl::DeadlineExceededError(absl::StrCat(
                    "the deadline passed after ",
                    absl::FormatDuration(now - pending.enqueued),
                    " in the batching queue; the work was not started")),
                timing);
    } else {
      live.push_back(&task);
    }
  }
  if (live.empty()) {
    if (wide_slot != nullptr) wide_slot->fetch_sub(1);
    return;
  }

  std::vector<const OperationRequest*> requests;
  for (Task* task : live) requests.push_back(&task->request);
  CombinedWork work;
  std::vector<absl::StatusOr<attn::OpResult>> results =
      RunTogether(wide_slot != nullptr ? *runner.wide_engine : *runner.engine,
                  requests, &work);
  timing.batch_requests = static_cast<int>(live.size());
  timing.kernel = runner.clock->Now() - now;
  if (runner.observer) {
    runner.observer(BatchStats{OperationOf(*requests.front()),
                               static_cast<int>(live.size()),
                               work.computed_elements, work.useful_elements});
  }
  // The next wide batch may start as soon as this one's kernel is done:
  // answering the requests below costs ~1.5 ms of one core for a batch of
  // 32 (their responses built and handed to the transport), which the
  // next batch's pass over its stored version would otherwise wait out.
  if (wide_slot != nullptr) wide_slot->fetch_sub(1);
  for (size_t i = 0; i < live.size(); ++i) {
    // A member that ran alone (its operands differed, or the combined call
    // failed) was computed with no company.
    BatchTiming own = timing;
    if (i >= work.in_combined_call.size() || !work.in_combined_call[i]) {
      own.batch_requests = 1;
    } else {
      own.batch_requests = work.combined_requests;
    }
    live[i]->done(std::move(results[i]), own);
  }
}

bool Batcher::HasWorkOrStopping() const {
  return stopping_ || new_work_;
}

bool Batcher::NothingInHand() const { return in_hand_ == 0; }

void Batcher::SchedulerLoop() {
  absl::Time next = absl::InfiniteFuture();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wake for new work (a class may now be full) or the next due time.
      // The wait is on real time: the scheduler runs only with a real clock.
      mu_.AwaitWithDeadline(
          absl::Condition(this, &Batcher::HasWorkOrStopping), next);
      if (stopping_ && queued_ == 0) return;
    }
    next = FormDueBatches(/*from_scheduler=*/true);
  }
}

void Batcher::StartScheduler() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

void Batcher::Shutdown() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (scheduler_.joinable()) {
    scheduler_.join();  // its last pass hands every queued task on
  } else {
    FormDueBatches();
  }
  // Schedule (a due batch) and OnExecutorIdle form batches on their own
  // threads: one may have taken a batch off its queue, so that the queues
  // look empty, and not handed it on yet. Wait until it has.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &Batcher::NothingInHand));
}

}  // namespace attnserve
