// Per-model statistics since start-up, as Triton's ModelStatistics reports
// them: requests inferred, kernel executions (a batched execution is
// apportioned among its requests), success and failure counts with their
// whole-call time, queue time and compute time. The execution stack counts
// every call that names a model (server/execution/call_runner.h).
//
// Thread-safe.
#ifndef ATTNSERVE_SERVER_EXECUTION_MODEL_STATISTICS_H_
#define ATTNSERVE_SERVER_EXECUTION_MODEL_STATISTICS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnserve {

class ModelStatistics {
 public:
  struct Counts {
    uint64_t inferences = 0;
    double executions = 0;  // batched executions count 1/n per request
    uint64_t last_inference_ms = 0;  // Unix milliseconds; 0: never
    uint64_t success_count = 0, success_ns = 0;
    uint64_t fail_count = 0, fail_ns = 0;
    uint64_t queue_count = 0, queue_ns = 0;
    uint64_t compute_count = 0, compute_ns = 0;
  };

  // Counts one finished call of `model`: its status, whole time, and, when
  // the kernel ran, its queue and compute time and the requests it was
  // batched with.
  void Record(const std::string& model, const absl::Status& status,
              absl::Duration total, bool computed, absl::Duration queue,
              absl::Duration compute, int batch_requests);

  // The counts of `model` (all zero for one never called).
  Counts Get(const std::string& model) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Counts> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_MODEL_STATISTICS_H_
