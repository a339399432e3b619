// One KServe v2 inference (a ModelInfer call, or one request of a
// ModelStreamInfer stream) from request to response: the model resolved,
// the request's structure checked (server/kserve/request.h), its
// priority and timeout applied, then the call handed to the execution stack
// (CallRunner::RunOp), whose decode step and encode step are this object's
// Decode and Encode. The model's kind (server/models/model_kinds.h)
// decides what the decoded inputs become and what the result's tensors are
// called; attention_weights are computed only when requested by name.
//
// Thread safety: Decode runs on the calling thread, then Encode once on a
// worker, never at the same time; the core orders them.
#ifndef ATTNSERVE_SERVER_KSERVE_INFER_CALL_H_
#define ATTNSERVE_SERVER_KSERVE_INFER_CALL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "inference/grpc_service.pb.h"
#include "server/kserve/codec.h"
#include "server/models/model_catalogue.h"
#include "server/execution/batchable.h"
#include "server/execution/call_runner.h"
#include "server/execution/element_budget.h"

namespace attnserve {

class KServeInferCall {
 public:
  // Starts one inference; does not block. `responder` answers it: at once
  // (before Start returns, counted by CallRunner::Refuse) for an unknown
  // model (NOT_FOUND, under rpc="unresolved"), a request of the wrong
  // structure or with a bad priority or timeout (INVALID_ARGUMENT, under the
  // model's operation); otherwise once the core is done with it, with
  // whatever the core answers (server/execution/call_runner.h). `request` and
  // `response` must live until then; `catalogue` and `runner` only for the
  // duration of Start.
  static void Start(const ModelCatalogue& catalogue, CallRunner* runner,
                    const inference::ModelInferRequest* request,
                    inference::ModelInferResponse* response,
                    CallContext context, CallResponder* responder);

  // Use Start; public for std::make_shared. `outputs` are the outputs to
  // return, in order (RequestedOutputs).
  KServeInferCall(const inference::ModelInferRequest* request,
                  inference::ModelInferResponse* response, ServedModel model,
                  std::vector<std::string> outputs);
  KServeInferCall(const KServeInferCall&) = delete;
  KServeInferCall& operator=(const KServeInferCall&) = delete;

  // The core's decode step: decodes the inputs, counting them in `budget`,
  // into the library's request for the model's kind. Its views point into
  // the request, this object and the repository model it holds, so this
  // object must outlive the computation. INVALID_ARGUMENT naming the input
  // or parameter; RESOURCE_EXHAUSTED over the budget.
  absl::StatusOr<OperationRequest> Decode(ElementBudget* budget);
  // The core's encode step: the result's tensors into the response, as the
  // requested outputs in order.
  void Encode(const attn::OpResult& result) const;

 private:
  const inference::ModelInferRequest* const request_;
  inference::ModelInferResponse* const response_;
  // Holds a repository model's weights until the kernel has run.
  const ServedModel model_;
  const std::vector<std::string> outputs_;
  ModelInputs inputs_;  // filled by Decode; the request's views point here
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_INFER_CALL_H_
