// attention.v1.AttentionService on gRPC's callback API.
//
// Each handler decodes and checks the request's tensors on the gRPC thread
// (cheap, and malformed requests never take a queue slot), then hands the
// kernel work to the WorkerPool and returns its reactor at once; the worker
// runs the engine, encodes the response and finishes the call. Work for a
// call that was cancelled, or whose deadline passed while it waited, is not
// started (CANCELLED / DEADLINE_EXCEEDED). Refused at once, before any
// work: a full queue (before decoding) and a call whose payload would pass
// the admission's byte bounds with RESOURCE_EXHAUSTED (retryable), a result
// that could not be sent with RESOURCE_EXHAUSTED (not as is), and every call
// of a draining server with UNAVAILABLE (server/admission.h). A kernel call
// holds its admission ticket until gRPC is done with it (its response sent).
//
// Thread-safe; borrows the engine, pool, metrics and admission, which must
// outlive it and the gRPC server it is registered with.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attn/engine.h"
#include "attn/validate.h"
#include "server/admission.h"
#include "server/attention_batcher.h"
#include "server/metrics.h"
#include "server/model_repository.h"
#include "server/tensor_codec.h"
#include "server/worker_pool.h"

namespace attnserve {

struct ServiceLimits {
  // Elements of all input tensors of one request together.
  int64_t max_request_elements = int64_t{1} << 26;
  // The largest response message; a larger result is answered with
  // RESOURCE_EXHAUSTED naming the limit (gRPC would fail the send anyway).
  int64_t max_response_bytes = int64_t{256} << 20;
  // FitBandwidth's save_as writes into the model repository: with token
  // authentication on, only calls whose token grants `save_as` may
  // (server/auth.h); others get PERMISSION_DENIED.
  bool save_as_needs_permission = false;
};

class AttentionService final
    : public attention::v1::AttentionService::CallbackService {
 public:
  // `batcher` may be null: every request then runs alone on the pool.
  // ScaledDotProductAttention requests go through the batcher when given;
  // the other RPCs always run alone.
  // `repository` may be null: weights_name and save_as then fail with
  // FAILED_PRECONDITION. `admission` may be null: every decoded call is
  // then admitted (no bound on bytes in flight, no drain).
  AttentionService(attn::Engine* engine, WorkerPool* pool,
                   AttentionBatcher* batcher, ServiceMetrics* metrics,
                   const ServiceLimits& limits,
                   ModelRepository* repository = nullptr,
                   Admission* admission = nullptr);

  grpc::ServerUnaryReactor* MaskedSoftmax(
      grpc::CallbackServerContext* context,
      const attention::v1::MaskedSoftmaxRequest* request,
      attention::v1::MaskedSoftmaxResponse* response) override;
  grpc::ServerUnaryReactor* BatchMatmul(
      grpc::CallbackServerContext* context,
      const attention::v1::BatchMatmulRequest* request,
      attention::v1::BatchMatmulResponse* response) override;
  grpc::ServerUnaryReactor* ScaledDotProductAttention(
      grpc::CallbackServerContext* context,
      const attention::v1::AttentionRequest* request,
      attention::v1::AttentionResponse* response) override;
  grpc::ServerUnaryReactor* AdditiveAttention(
      grpc::CallbackServerContext* context,
      const attention::v1::AdditiveAttentionRequest* request,
      attention::v1::AdditiveAttentionResponse* response) override;
  grpc::ServerUnaryReactor* NadarayaWatson(
      grpc::CallbackServerContext* context,
      const attention::v1::NadarayaWatsonRequest* request,
      attention::v1::NadarayaWatsonResponse* response) override;
  grpc::ServerUnaryReactor* FitBandwidth(
      grpc::CallbackServerContext* context,
      const attention::v1::FitBandwidthRequest* request,
      attention::v1::FitBandwidthResponse* response) override;

 
  // The building blocks the KServe service (server/inference_service.h)
  // shares, so that both APIs go through the same pool, batcher, limits and
  // metrics.

  // The kernel step of one call, run on a worker: computes, fills the
  // response and returns the name of the implementation that ran.
  using Work = std::function<absl::StatusOr<std::string>()>;
  // The decode step, run on the gRPC thread: checks the request and returns
  // the Work. Views it makes may point into `storage`.
  using Prepare =
      std::function<absl::StatusOr<Work>(ElementBudget*, DecodeStorage*)>;
  // Decodes an attention request on the gRPC thread (views may point into
  // `storage`), and encodes a computed result into the response.
  using DecodeAttention = std::function<absl::StatusOr<attn::AttentionRequest>(
      ElementBudget*, DecodeStorage*)>;
  using EncodeAttention = std::function<void(const attn::OpResult&)>;

  attn::Engine* engine() const { return engine_; }

  // Refuses, before anything is allocated or computed, a request whose
  // result could not be sent: RESOURCE_EXHAUSTED naming the result's shape,
  // its size and --max_message_bytes. (4 bytes per element is the least any
  // encoding takes.) OK for an invalid request: the kernel step reports
  // that, in the words of its API.
  // Counts the result in `budget` (the call's payload, for admission).
  absl::Status CheckResultFits(const absl::StatusOr<attn::ResultSize>& size,
                               ElementBudget* budget) const;
  ModelRepository* repository() const { return repository_; }

  // What one call came to, for per-model statistics.
  struct CallRecord {
    bool computed = false;  // the kernel ran
    absl::Duration queue = absl::ZeroDuration();    // waiting for the kernel
    absl::Duration compute = absl::ZeroDuration();  // the kernel, encoding
    int batch_requests = 1;  // requests computed together with this one
  };
  // Called once per call as it finishes, on the finishing thread.
  using CallObserver = std::function<void(
      const absl::Status& status, const CallRecord& record,
      absl::Duration total)>;

  // Serves one call: decode (here), compute (on the pool), finish. `info`
  // may be null (a response without ExecutionInfo); `observer` may be empty.
  grpc::ServerUnaryReactor* Serve(Rpc rpc, grpc::CallbackServerContext* context,
                                  google::protobuf::Message* response,
                                  attention::v1::ExecutionInfo* info,
                                  const Prepare& prepare,
                                  CallObserver observer = {});
  // Serves one attention call through the batcher when there is one, else
  // like Serve.
  grpc::ServerUnaryReactor* ServeAttention(
      Rpc rpc, grpc::CallbackServerContext* context,
      google::protobuf::Message* response, attention::v1::ExecutionInfo* info,
      const DecodeAttention& decode, EncodeAttention encode,
      CallObserver observer = {});

 private:
  using Finish = std::function<void(const absl::Status&)>;

  // A kernel call's reactor: it holds the call's admission ticket until
  // gRPC is done with the call (OnDone), then deletes itself.
  class CallReactor;
  // The reactor of a new kernel call, and the status that refuses it at
  // once when the server is draining (then finish it with that).
  CallReactor* NewReactor(absl::Status* refused) const;
  // Admits the decoded call (its payload counted in `budget`) and gives
  // the reactor its ticket.
  absl::Status AdmitCall(grpc::CallbackServerContext* context,
                         const ElementBudget& budget,
                         CallReactor* reactor) const;

  // Starts a call: counts it in flight and returns what finishes it (and
  // reports to `observer`, with what `record` holds by then).
  Finish StartCall(Rpc rpc, grpc::ServerUnaryReactor* reactor,
                   absl::Time received, CallObserver observer = {},
                   std::shared_ptr<CallRecord> record = nullptr);
  // Records a computed call (metrics, info, `record`, the response size
  // limit) and finishes it.
  void Complete(Rpc rpc, google::protobuf::Message* response,
                attention::v1::ExecutionInfo* info, absl::Time received,
                absl::Time started, absl::Duration kernel,
                const absl::StatusOr<std::string>& implementation,
                const Finish& finish, CallRecord* record = nullptr);

  attn::Engine* const engine_;
  WorkerPool* const pool_;
  AttentionBatcher* const batcher_;
  ServiceMetrics* const metrics_;
  const ServiceLimits limits_;
  ModelRepository* const repository_;
  Admission* const admission_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
