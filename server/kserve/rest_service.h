// The KServe v2 REST front end: the Open Inference Protocol's HTTP
// endpoints and Triton's extensions that the gRPC KServe service also
// serves, over the same execution stack, catalogue and model control. A thin
// front end like server/kserve/inference_service.h: each request is routed to
// the concept it asks for; inference is decoded into the ModelInferRequest
// the gRPC service would have received (server/kserve/rest.h) and run
// through the same KServeInferCall.
//
//   GET  /v2/health/live | /v2/health/ready
//   GET  /v2                                      server metadata
//   GET  /v2/models/stats                         every model's statistics
//   GET  /v2/models/{m}[/versions/{v}]            model metadata
//   GET  /v2/models/{m}[/versions/{v}]/ready      200, or 503 when draining
//   GET  /v2/models/{m}[/versions/{v}]/config     Triton's model config
//   GET  /v2/models/{m}[/versions/{v}]/stats      its statistics
//   POST /v2/models/{m}[/versions/{v}]/infer      inference
//   POST /v2/repository/index                     the repository's models
//   POST /v2/repository/models/{m}/load | unload  model control
//
// Errors are {"error": "..."} with the HTTP status of the gRPC code
// (HttpStatusOf); health and readiness answer with an empty body.
//
// It knows no HTTP library: server/transport/http_server.h hands it a RestCall
// and a RestResponder per request (server/transport/rest_call.h).
// Thread-safe; borrows the execution stack and the catalogue, which must
// outlive it.
#ifndef ATTNSERVE_SERVER_KSERVE_REST_SERVICE_H_
#define ATTNSERVE_SERVER_KSERVE_REST_SERVICE_H_

#include <string>

#include "absl/status/status.h"

#include "server/execution/call_runner.h"
#include "server/execution/execution_stack.h"
#include "server/kserve/rest.h"
#include "server/models/model_catalogue.h"
#include "server/transport/rest_call.h"

namespace attnserve {

class KServeRestService final : public RestHandler {
 public:
  // As InferenceService's constructor (server/kserve/inference_service.h);
  // health/ready and a model's ready report the stack's readiness.
  KServeRestService(ExecutionStack* stack, ModelCatalogue* catalogue,
                    int max_batch_size);

  // Routes `call`; `responder` answers it, before Handle returns or later
  // (inference, from a worker).
  void Handle(const RestCall& call, RestResponder* responder) override;

 private:
  void Infer(const RestCall& call, const std::string& model,
             const std::string& version, RestResponder* responder);
  // Answers a request that resolved to no model or operation (an unknown
  // route, a malformed body), counting it (ServiceMetrics::RequestRefused).
  void Unresolved(RestResponder* responder, const absl::Status& status);

  ExecutionStack* const stack_;
  CallRunner* const calls_;
  ModelCatalogue* const catalogue_;
  const int max_batch_size_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_REST_SERVICE_H_
