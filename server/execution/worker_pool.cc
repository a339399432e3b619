#include "server/execution/worker_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attnserve {

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(
    const Options& options) {
  if (options.threads < 1 || options.max_queue < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker pool: threads (", options.threads,
                     ") and max_queue (", options.max_queue,
                     ") must be at least 1"));
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool(options));
  for (int i = 0; i < options.threads; ++i) {
    pool->threads_.emplace_back([raw = pool.get()] { raw->Work(); });
  }
  return pool;
}

WorkerPool::WorkerPool(const Options& options) : options_(options) {}

WorkerPool::~WorkerPool() { Shutdown(); }

absl::Status WorkerPool::RoomLocked() const {
  if (stopping_) {
    return absl::UnavailableError("the server is shutting down");
  }
  if (queued_ >= options_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the work queue is full (", options_.max_queue,
        " requests waiting, --max_queue); retry later"));
  }
  return absl::OkStatus();
}

absl::Status WorkerPool::CheckRoom() const {
  absl::MutexLock lock(&mu_);
  return RoomLocked();
}

absl::Status WorkerPool::Schedule(std::function<void()> task,
                                  uint64_t priority) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RoomLocked());
  const uint64_t level = priority == 0 ? UINT64_MAX : priority;
  queue_[level].push_back(std::move(task));
  ++queued_;
  return absl::OkStatus();
}

int WorkerPool::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

int WorkerPool::available_threads() const {
  absl::MutexLock lock(&mu_);
  return waiting_ - queued_;
}

void WorkerPool::SetIdleCallback(std::function<void()> on_idle) {
  on_idle_ = std::move(on_idle);
}

void WorkerPool::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock join_lock(&join_mu_);
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

bool WorkerPool::HasWorkOrStopping() const {
  return stopping_ || queued_ > 0;
}

void WorkerPool::Work() {
  {
    absl::MutexLock lock(&mu_);
    ++waiting_;
  }
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WorkerPool::HasWorkOrStopping));
      --waiting_;
      if (queued_ == 0) return;  // stopping, and nothing left to run
      auto first = queue_.begin();  // the highest priority waiting
      task = std::move(first->second.front());
      first->second.pop_front();
      if (first->second.empty()) queue_.erase(first);
      --queued_;
    }
    task();
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      // Free from here on, before the idle callback runs: a batcher asks
      // it, from the callback, whether a thread can take a batch now
      // (available_threads()); not counting this one made it wait out
      // max_queue_delay with a thread free.
      ++waiting_;
      idle = queued_ == 0;
    }
    if (idle && on_idle_) on_idle_();
  }
}

}  // namespace attnserve
