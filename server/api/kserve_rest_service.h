// The KServe v2 REST front end: the Open Inference Protocol's HTTP
// endpoints and Triton's extensions that the gRPC KServe service also
// serves, over the same serving core, catalogue and model control. A thin
// front end like server/api/inference_service.h: each request is routed to
// the concept it asks for; inference is decoded into the ModelInferRequest
// the gRPC service would have received (server/api/kserve_rest.h) and run
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
// It knows no HTTP library: server/api/http_server.h hands it a RestCall
// and a RestResponder per request. Thread-safe; borrows the core's
// CallRunner and the repository, which must outlive it.
#ifndef ATTNSERVE_SERVER_API_KSERVE_REST_SERVICE_H_
#define ATTNSERVE_SERVER_API_KSERVE_REST_SERVICE_H_

#include <atomic>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "server/api/kserve_model_control.h"
#include "server/api/kserve_models.h"
#include "server/api/kserve_rest.h"
#include "server/core/admission.h"
#include "server/core/batcher.h"
#include "server/core/call_runner.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// One HTTP request as the front end sees it. Borrowed for the duration of
// Handle; `body` must live until the call's Reply.
struct RestCall {
  absl::string_view method;  // "GET", "POST", ...
  absl::string_view path;    // the URI's path, still percent-encoded
  absl::string_view body;
  // The Inference-Header-Content-Length header, when given.
  std::optional<absl::string_view> json_header_length;
  std::string peer;  // the connection, for admission's per-peer share
  // The caller's bearer token grants model_control (or tokens are off).
  bool may_control_models = true;
};

// Answers one RestCall, exactly once, from any thread.
class RestResponder {
 public:
  virtual ~RestResponder() = default;
  // `content_type` is empty for an empty body. Keep `ticket` (the call's
  // admitted bytes) until the response has been sent.
  virtual void Reply(int http_status, std::string content_type, RestBody body,
                     Admission::Ticket ticket) = 0;
};

class KServeRestService {
 public:
  // As InferenceService's constructor (server/api/inference_service.h).
  KServeRestService(CallRunner* calls, ModelRepository* repository,
                    const BatchingOptions* batching, int max_batch_size,
                    const ModelControl& model_control = {});

  // Readiness (health/ready, a model's ready); false while draining.
  void SetReady(bool ready) { ready_.store(ready); }

  // Routes `call`; `responder` answers it, before Handle returns or later
  // (inference, from a worker).
  void Handle(const RestCall& call, RestResponder* responder);

 private:
  void Infer(const RestCall& call, const std::string& model,
             const std::string& version, RestResponder* responder);

  CallRunner* const calls_;
  const ModelCatalogue catalogue_;
  ModelController model_controller_;
  const std::optional<BatchingOptions> batching_;
  const int max_batch_size_;
  std::atomic<bool> ready_{true};
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_KSERVE_REST_SERVICE_H_
