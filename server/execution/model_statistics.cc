#include "server/execution/model_statistics.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace attnserve {

void ModelStatistics::Record(const std::string& model,
                             const absl::Status& status, absl::Duration total,
                             bool computed, absl::Duration queue,
                             absl::Duration compute, int batch_requests) {
  absl::MutexLock lock(&mu_);
  Counts& counts = counts_[model];
  const uint64_t total_ns = absl::ToInt64Nanoseconds(total);
  if (status.ok()) {
    ++counts.inferences;
    counts.executions += 1.0 / std::max(batch_requests, 1);
    counts.last_inference_ms =
        static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
    ++counts.success_count;
    counts.success_ns += total_ns;
  } else {
    ++counts.fail_count;
    counts.fail_ns += total_ns;
  }
  if (computed) {
    ++counts.queue_count;
    counts.queue_ns += absl::ToInt64Nanoseconds(queue);
    ++counts.compute_count;
    counts.compute_ns += absl::ToInt64Nanoseconds(compute);
  }
}

ModelStatistics::Counts ModelStatistics::Get(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = counts_.find(model);
  return it == counts_.end() ? Counts{} : it->second;
}

}  // namespace attnserve
