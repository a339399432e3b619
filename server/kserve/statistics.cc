#include "server/kserve/statistics.h"

#include <cmath>
#include <cstdint>

#include "server/models/model_kind.h"

namespace attnserve {

void ReportModelStatistics(const std::string& name,
                           const ModelStatistics::Counts& counts,
                           inference::ModelStatistics* out) {
  out->set_name(name);
  out->set_version(kServedModelVersion);
  out->set_last_inference(counts.last_inference_ms);
  out->set_inference_count(counts.inferences);
  out->set_execution_count(static_cast<uint64_t>(std::llround(counts.executions)));
  auto* inference = out->mutable_inference_stats();
  inference->mutable_success()->set_count(counts.success_count);
  inference->mutable_success()->set_ns(counts.success_ns);
  inference->mutable_fail()->set_count(counts.fail_count);
  inference->mutable_fail()->set_ns(counts.fail_ns);
  inference->mutable_queue()->set_count(counts.queue_count);
  inference->mutable_queue()->set_ns(counts.queue_ns);
  inference->mutable_compute_infer()->set_count(counts.compute_count);
  inference->mutable_compute_infer()->set_ns(counts.compute_ns);
  inference->mutable_compute_input()->set_count(counts.compute_count);
  inference->mutable_compute_output()->set_count(counts.compute_count);
}

}  // namespace attnserve
