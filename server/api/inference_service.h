// The KServe v2 / Open Inference Protocol gRPC service
// (inference.GRPCInferenceService), with the Triton extensions its tools
// need (ModelConfig, ModelStatistics, ModelStreamInfer, the model
// repository's index, load and unload), on the same port as attention.v1.
//
// Each operation is a model with fixed tensor names (see README, "KServe v2"):
// masked_softmax, batch_matmul, dot_product_attention, nadaraya_watson; and
// every model of the repository: additive attention with its weights
// (backend additive_attention, the tensors of dot_product_attention) and
// fitted Nadaraya-Watson bandwidths (backend nadaraya_watson).
// Inputs come as raw_input_contents or typed contents (FP32; INT32 or INT64
// for valid_lens); outputs always go back as raw_output_contents, one per
// output in order. attention_weights are computed only when requested by
// name. Inference is a front end of the serving core
// (server/core/call_runner.h), like the typed API: the same pool, batcher,
// limits and metrics. ModelStatistics reports the core's per-model counts
// (server/core/model_statistics.h): requests inferred (inference_count),
// kernel executions (execution_count; a batched execution is apportioned
// among its requests), success and failure counts with their whole-call
// time, queue time and compute time (compute_infer; compute_input and
// compute_output are part of it and reported as zero).
//
// Thread-safe; borrows `calls` and `repository`, which must outlive it.
#ifndef ATTNSERVE_SERVER_API_INFERENCE_SERVICE_H_
#define ATTNSERVE_SERVER_API_INFERENCE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "inference/grpc_service.grpc.pb.h"
#include "server/core/call_runner.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// Live model control (Triton's --model-control-mode): with `explicit_mode`,
// RepositoryModelLoad and RepositoryModelUnload load, reload and unload the
// repository's models while the server runs (calls in flight on an unloaded
// model finish with it: server/repository/model_repository.h); without it
// they answer FAILED_PRECONDITION. With `needs_permission` (token
// authentication on), only tokens with the model_control permission may
// (server/api/auth.h); others get PERMISSION_DENIED. Built-in models are
// always served: loading one is a no-op, unloading one INVALID_ARGUMENT.
struct ModelControl {
  bool explicit_mode = false;
  bool needs_permission = false;
};

class InferenceService final
    : public inference::GRPCInferenceService::CallbackService {
 public:
  // `repository` may be null (the built-in models only). `batching`: the
  // batcher's options when dot_product_attention goes through one (its
  // ModelConfig then reports them as dynamic_batching), or null;
  // `max_batch_size` is reported either way.
  InferenceService(CallRunner* calls, ModelRepository* repository,
                   const BatchingOptions* batching, int max_batch_size,
                   const ModelControl& model_control = {});

  // ServerReady and ModelReady report this; false while draining.
  void SetReady(bool ready) { ready_.store(ready); }

  grpc::ServerUnaryReactor* ServerLive(
      grpc::CallbackServerContext* context,
      const inference::ServerLiveRequest* request,
      inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(
      grpc::CallbackServerContext* context,
      const inference::ServerReadyRequest* request,
      inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(
      grpc::CallbackServerContext* context,
      const inference::ModelReadyRequest* request,
      inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(
      grpc::CallbackServerContext* context,
      const inference::ServerMetadataRequest* request,
      inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(
      grpc::CallbackServerContext* context,
      const inference::ModelMetadataRequest* request,
      inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(
      grpc::CallbackServerContext* context,
      const inference::ModelConfigRequest* request,
      inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryIndex(
      grpc::CallbackServerContext* context,
      const inference::RepositoryIndexRequest* request,
      inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(
      grpc::CallbackServerContext* context,
      const inference::ModelStatisticsRequest* request,
      inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(
      grpc::CallbackServerContext* context,
      const inference::ModelInferRequest* request,
      inference::ModelInferResponse* response) override;
  // Triton's streaming inference (server/api/inference_stream.cc): each
  // request read is a call of its own through the core, as ModelInfer's;
  // each answer is written as it completes (out of order), with its
  // request's id, and an error goes in error_message without ending the
  // stream.
  grpc::ServerBidiReactor<inference::ModelInferRequest,
                          inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;

  // The tensors of a served model, as ModelMetadata reports them.
  struct TensorSpec {
    std::string name;
    std::string datatype;
    std::vector<int64_t> shape;  // -1: variable; batch dim first if batched
    bool optional = false;
  };
  struct ModelSpec {
    std::string name;
    Rpc rpc;  // whose metrics and limits it shares
    std::vector<TensorSpec> inputs;
    std::vector<TensorSpec> outputs;
    std::vector<std::string> default_outputs;  // when none are requested
  };
  // The built-in models.
  static const std::vector<ModelSpec>& Models();
  // The tensors a repository model is served with, by its backend: an
  // additive_attention model's own, or a fitted bandwidth's (those of the
  // built-in nadaraya_watson), under `name`.
  static ModelSpec RepositorySpec(const std::string& name,
                                  const RepositoryModel& model);

 private:
  class StreamReactor;

  struct Resolved {
    ModelSpec spec;
    std::shared_ptr<const RepositoryModel> held;  // null for built-ins
  };
  // NOT_FOUND naming the served models.
  absl::StatusOr<Resolved> Resolve(const std::string& name,
                                   const std::string& version) const;
  std::vector<std::string> ModelNames() const;
  // Starts one inference of ModelInfer or ModelStreamInfer: resolves the
  // model, decodes, and hands the call to the core; `responder` answers it
  // (at once for an unknown model or output). `request` and `response` must
  // live until then.
  void Infer(const inference::ModelInferRequest* request,
             inference::ModelInferResponse* response, CallContext context,
             CallResponder* responder);
  // Why a load or unload of `model_name` may not happen, if it may not.
  absl::Status CheckModelControl(grpc::CallbackServerContext* context,
                                 const std::string& model_name) const;

  CallRunner* const calls_;
  ModelRepository* const repository_;
  const bool batching_;
  const BatchingOptions batching_options_;
  const int max_batch_size_;
  const ModelControl model_control_;
  std::atomic<bool> ready_{true};
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_INFERENCE_SERVICE_H_
