// Triton's ModelStatistics for one model, from the execution stack's counts
// (server/execution/model_statistics.h): requests inferred (inference_count),
// kernel executions (execution_count; a batched execution is apportioned
// among its requests, so the count is rounded), success and failure counts
// with their whole-call time, queue time and compute time (compute_infer;
// compute_input and compute_output are part of it and reported as zero
// time, with its count).
//
// Pure function of its arguments; thread-compatible; does not block.
#ifndef ATTNSERVE_SERVER_KSERVE_STATISTICS_H_
#define ATTNSERVE_SERVER_KSERVE_STATISTICS_H_

#include <string>

#include "inference/grpc_service.pb.h"
#include "server/execution/model_statistics.h"

namespace attnserve {

void ReportModelStatistics(const std::string& name,
                           const ModelStatistics::Counts& counts,
                           inference::ModelStatistics* out);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_STATISTICS_H_
