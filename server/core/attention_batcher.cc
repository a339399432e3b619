#include "server/core/attention_batcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/validate.h"

namespace attnserve {
namespace {

// One request's place in an assembled batch.
struct Member {
  attn::AttentionParams params;  // validated; pointers into its request
  bool multi_head = false;
  int64_t batch_offset = 0;      // first batch row in the assembled batch
};

// Copies `rows` rows of `width` floats from src (row stride width) to dst
// (row stride width); the caller zero-fills the padding rows.
void CopyRows(const float* src, int64_t rows, int64_t width, float* dst) {
  std::memcpy(dst, src, sizeof(float) * rows * width);
}

// Splits the assembled result into each member's output (and weights).
attn::OpResult Slice(const attn::OpResult& all, const Member& m, int64_t lq,
                     int64_t lk) {
  const attn::AttentionParams& p = m.params;
  attn::OpResult result;
  result.implementation = all.implementation;
  attn::Shape out_shape = m.multi_head
                              ? attn::Shape{p.batch, p.heads, p.lq, p.dv}
                              : attn::Shape{p.batch, p.lq, p.dv};
  result.output = attn::Tensor::Uninitialized(out_shape);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t src = ((m.batch_offset + b) * p.heads + h) * lq;
      const int64_t dst = (b * p.heads + h) * p.lq;
      CopyRows(all.output.data.data() + src * p.dv, p.lq, p.dv,
               result.output.data.data() + dst * p.dv);
    }
  }
  if (!all.weights.empty()) {
    attn::Shape w_shape = m.multi_head
                              ? attn::Shape{p.batch, p.heads, p.lq, p.lk}
                              : attn::Shape{p.batch, p.lq, p.lk};
    result.weights = attn::Tensor::Uninitialized(w_shape);
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t i = 0; i < p.lq; ++i) {
          const int64_t src = (((m.batch_offset + b) * p.heads + h) * lq + i);
          const int64_t dst = ((b * p.heads + h) * p.lq + i);
          std::memcpy(result.weights.data.data() + dst * p.lk,
                      all.weights.data.data() + src * lk,
                      sizeof(float) * p.lk);
        }
      }
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionBatcher>> AttentionBatcher::Create(
    const BatchingOptions& options, attn::Engine* engine, const Clock* clock,
    Executor executor, BatchObserver observer,
    ExecutorAvailable executor_available) {
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
  return std::unique_ptr<AttentionBatcher>(new AttentionBatcher(
      options, engine, clock, std::move(executor), std::move(observer),
      std::move(executor_available)));
}

AttentionBatcher::AttentionBatcher(const BatchingOptions& options,
                                   attn::Engine* engine, const Clock* clock,
                                   Executor executor, BatchObserver observer,
                                   ExecutorAvailable executor_available)
    : options_(options),
      clock_(clock),
      executor_(std::move(executor)),
      executor_available_(std::move(executor_available)),
      runner_(std::make_shared<const Runner>(
          Runner{engine, clock, std::move(observer)})) {}

AttentionBatcher::~AttentionBatcher() { Shutdown(); }

absl::Status AttentionBatcher::Schedule(std::unique_ptr<Task> task) {
  absl::StatusOr<attn::Plan<attn::AttentionParams>> plan =
      attn::ValidateAttention(task->request);
  if (!plan.ok()) return plan.status();
  const attn::AttentionParams& p = plan->params;
  const ClassKey key{task->request.queries.rank(), p.heads, p.d, p.dv,
                     static_cast<int>(p.score), p.scale, p.causal,
                     static_cast<int>(p.precision), task->request.return_weights};
  const int64_t elements =
      p.batch * p.heads * (p.lq * p.d + p.lk * (p.d + p.dv));
  const absl::Time now = clock_->Now();
  bool due_now = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return absl::UnavailableError("the server is shutting down");
    }
    if (queued_ >= options_.max_queue_size) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the batching queue is full (", options_.max_queue_size,
          " requests waiting, --max_queue); retry later"));
    }
    Queue& queue = queues_[key];
    queue.pending.push_back(Pending{std::move(task), now, elements});
    queue.elements += elements;
    ++queued_;
    const int count = static_cast<int>(queue.pending.size());
    due_now = count >= options_.max_batch_requests ||
              queue.elements >= options_.max_batch_elements ||
              std::find(options_.preferred_batch_sizes.begin(),
                        options_.preferred_batch_sizes.end(),
                        count) != options_.preferred_batch_sizes.end() ||
              (executor_available_ && executor_available_());
    // Otherwise wake the scheduler only for a class's first request (a new
    // deadline); waking it on every arrival would cost a context switch each.
    if (!due_now && count == 1) new_work_ = true;
  }
  // A due batch is formed here rather than after a hop to the scheduler.
  if (due_now) FormDueBatches();
  return absl::OkStatus();
}

int AttentionBatcher::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

std::vector<AttentionBatcher::Pending> AttentionBatcher::TakeDueBatch(
    Queue& queue, absl::Time now) {
  std::vector<Pending> batch;
  const int count = static_cast<int>(queue.pending.size());
  if (count == 0) return batch;
  // How many of the oldest fit the element budget (at least one).
  int fit = 0;
  int64_t elements = 0;
  for (const Pending& pending : queue.pending) {
    if (fit == options_.max_batch_requests) break;
    if (fit > 0 &&
        elements + pending.padded_elements_alone > options_.max_batch_elements) {
      break;
    }
    elements += pending.padded_elements_alone;
    ++fit;
  }
  int take = 0;
  if (fit < count || count >= options_.max_batch_requests) {
    take = fit;  // full
  } else if (stopping_ ||
             now - queue.pending.front().enqueued >= options_.max_queue_delay ||
             (executor_available_ && executor_available_())) {
    take = fit;  // waited long enough, or a thread is free to run it now
  } else {
    for (int size : options_.preferred_batch_sizes) {
      if (size <= count && size > take) take = size;
    }
  }
  for (int i = 0; i < take; ++i) {
    queue.elements -= queue.pending.front().padded_elements_alone;
    batch.push_back(std::move(queue.pending.front()));
    queue.pending.pop_front();
  }
  queued_ -= take;
  return batch;
}

absl::Time AttentionBatcher::FormDueBatches(bool from_scheduler) {
  std::vector<std::vector<Pending>> due;
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
    for (auto it = queues_.begin(); it != queues_.end();) {
      Queue& queue = it->second;
      for (std::vector<Pending> batch = TakeDueBatch(queue, now); !batch.empty();
           batch = TakeDueBatch(queue, now)) {
        due.push_back(std::move(batch));
      }
      if (queue.pending.empty()) {
        it = queues_.erase(it);
      } else {
        next = std::min(next, queue.pending.front().enqueued +
                                  options_.max_queue_delay);
        ++it;
      }
    }
    if (!from_scheduler && next != absl::InfiniteFuture()) new_work_ = true;
    in_hand_ += static_cast<int>(due.size());
  }
  if (due.empty()) return next;
  for (std::vector<Pending>& batch : due) Dispatch(std::move(batch));
  absl::MutexLock lock(&mu_);
  in_hand_ -= static_cast<int>(due.size());
  return next;
}

void AttentionBatcher::Dispatch(std::vector<Pending> batch) {
  auto shared = std::make_shared<std::vector<Pending>>(std::move(batch));
  const absl::Status status =
      executor_([runner = runner_, shared] { RunBatch(*runner, *shared); });
  if (!status.ok()) {
    for (Pending& pending : *shared) {
      pending.task->done(status, BatchTiming{clock_->Now()});
    }
  }
}

void AttentionBatcher::RunBatch(const Runner& runner,
                                std::vector<Pending>& batch) {
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
  if (live.empty()) return;

  // Validated params of every member, and the padded batch's extent.
  std::vector<Member> members;
  int64_t total_batch = 0, lq = 0, lk = 0, useful = 0;
  bool needs_lengths = false;
  for (Task* task : live) {
    // Validated at Schedule: cannot fail here.
    Member m{attn::ValidateAttention(task->request)->params,
             task->request.queries.rank() == 4, total_batch};
    total_batch += m.params.batch;
    lq = std::max(lq, m.params.lq);
    lk = std::max(lk, m.params.lk);
    useful += m.params.batch * m.params.heads * m.params.lq * m.params.lk;
    needs_lengths |= m.params.valid.kind != attn::ValidLengths::Kind::kNone;
    members.push_back(m);
  }
  const attn::AttentionParams& first = members.front().params;
  const int64_t heads = first.heads, d = first.d, dv = first.dv;
  for (const Member& m : members) {
    needs_lengths |= m.params.lq != lq || m.params.lk != lk;
  }
  if (runner.observer) {
    runner.observer(BatchStats{static_cast<int>(live.size()),
                               total_batch * heads * lq * lk, useful});
  }
  timing.batch_requests = static_cast<int>(live.size());
  if (live.size() == 1) {
    absl::StatusOr<attn::OpResult> result =
        runner.engine->Attention(live.front()->request);
    timing.kernel = runner.clock->Now() - now;
    live.front()->done(std::move(result), timing);
    return;
  }

  // Assemble the padded batch: zero rows past each member's Lq and Lk.
  attn::Tensor q = attn::Tensor::Zeros({total_batch, heads, lq, d});
  attn::Tensor k = attn::Tensor::Zeros({total_batch, heads, lk, d});
  attn::Tensor v = attn::Tensor::Zeros({total_batch, heads, lk, dv});
  std::vector<int32_t> lengths;
  if (needs_lengths) lengths.assign(total_batch * lq, 0);
  for (const Member& m : members) {
    const attn::AttentionParams& p = m.params;
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t src = b * heads + h;
        const int64_t dst = (m.batch_offset + b) * heads + h;
        CopyRows(p.q + src * p.lq * d, p.lq, d, q.data.data() + dst * lq * d);
        CopyRows(p.k + src * p.lk * d, p.lk, d, k.data.data() + dst * lk * d);
        CopyRows(p.v + src * p.lk * dv, p.lk, dv,
                 v.data.data() + dst * lk * dv);
      }
      if (needs_lengths) {
        for (int64_t i = 0; i < p.lq; ++i) {
          lengths[(m.batch_offset + b) * lq + i] =
              static_cast<int32_t>(p.valid.Limit(b, i, p.lk));
        }
      }
    }
  }
  const attn::AttentionRequest& like = live.front()->request;
  attn::AttentionRequest combined;
  const bool multi_head = members.front().multi_head;
  auto shape = [&](int64_t length, int64_t depth) {
    return multi_head ? attn::Shape{total_batch, heads, length, depth}
                      : attn::Shape{total_batch, length, depth};
  };
  combined.queries = attn::TensorView{q.data.data(), shape(lq, d)};
  combined.keys = attn::TensorView{k.data.data(), shape(lk, d)};
  combined.values = attn::TensorView{v.data.data(), shape(lk, dv)};
  if (needs_lengths) {
    combined.valid_lens = attn::LengthsView{lengths.data(), {total_batch, lq}};
  }
  combined.causal = like.causal;
  combined.scale = first.scale;
  combined.score = like.score;
  combined.return_weights = like.return_weights;
  combined.precision = like.precision;

  absl::StatusOr<attn::OpResult> all = runner.engine->Attention(combined);
  timing.kernel = runner.clock->Now() - now;
  for (size_t i = 0; i < live.size(); ++i) {
    if (!all.ok()) {
      live[i]->done(all.status(), timing);
    } else {
      live[i]->done(Slice(*all, members[i], lq, lk), timing);
    }
  }
}

bool AttentionBatcher::HasWorkOrStopping() const {
  return stopping_ || new_work_;
}

bool AttentionBatcher::NothingInHand() const { return in_hand_ == 0; }

void AttentionBatcher::SchedulerLoop() {
  absl::Time next = absl::InfiniteFuture();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wake for new work (a class may now be full) or the next due time.
      // The wait is on real time: the scheduler runs only with a real clock.
      mu_.AwaitWithDeadline(
          absl::Condition(this, &AttentionBatcher::HasWorkOrStopping), next);
      if (stopping_ && queued_ == 0) return;
    }
    next = FormDueBatches(/*from_scheduler=*/true);
  }
}

void AttentionBatcher::StartScheduler() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

void AttentionBatcher::Shutdown() {
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
  mu_.Await(absl::Condition(this, &AttentionBatcher::NothingInHand));
}

}  // namespace attnserve
