// The KServe v2 / Open Inference Protocol gRPC service
// (inference.GRPCInferenceService), with the Triton extensions its tools
// need (ModelConfig, RepositoryIndex), on the same port as attention.v1.
//
// Each operation is a model with fixed tensor names (see README, "KServe v2"):
// masked_softmax, batch_matmul, dot_product_attention, nadaraya_watson; and
// every model of the repository: additive attention with its weights
// (backend additive_attention, the tensors of dot_product_attention) and
// fitted Nadaraya-Watson bandwidths (backend nadaraya_watson).
// Inputs come as raw_input_contents or typed contents (FP32; INT32 or INT64
// for valid_lens); outputs always go back as raw_output_contents, one per
// output in order. attention_weights are computed only when requested by
// name. Inference goes through the AttentionService's building blocks, so the
// pool, the batcher, the limits and the metrics are the same as the typed
// API's. ModelStatistics reports, per model, since start-up: requests
// inferred (inference_count), kernel executions (execution_count; a batched
// execution is apportioned among its requests), success and failure counts
// with their whole-call time, queue time and compute time (compute_infer;
// compute_input and compute_output are part of it and reported as zero).
//
// Thread-safe; borrows `calls`, which must outlive it.
#ifndef ATTNSERVE_SERVER_INFERENCE_SERVICE_H_
#define ATTNSERVE_SERVER_INFERENCE_SERVICE_H_

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
#include "server/attention_service.h"
#include "server/model_repository.h"

namespace attnserve {

class InferenceService final
    : public inference::GRPCInferenceService::CallbackService {
 public:
  // `batching`: the batcher's options when dot_product_attention goes
  // through one (its ModelConfig then reports them as dynamic_batching), or
  // null; `max_batch_size` is reported either way.
  InferenceService(AttentionService* calls, const BatchingOptions* batching,
                   int max_batch_size);

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
  struct Resolved {
    ModelSpec spec;
    std::shared_ptr<const RepositoryModel> held;  // null for built-ins
  };
  // NOT_FOUND naming the served models.
  absl::StatusOr<Resolved> Resolve(const std::string& name,
                                   const std::string& version) const;
  std::vector<std::string> ModelNames() const;

  struct Stats {
    uint64_t inferences = 0;
    double executions = 0;  // batched executions count 1/n per request
    uint64_t last_inference_ms = 0;
    uint64_t success_count = 0, success_ns = 0;
    uint64_t fail_count = 0, fail_ns = 0;
    uint64_t queue_count = 0, queue_ns = 0;
    uint64_t compute_count = 0, compute_ns = 0;
  };
  // Counts one finished ModelInfer call of `model`.
  void Record(const std::string& model, const absl::Status& status,
              const AttentionService::CallRecord& record, absl::Duration total);

  AttentionService* const calls_;
  const bool batching_;
  const BatchingOptions batching_options_;
  const int max_batch_size_;
  std::atomic<bool> ready_{true};
  mutable absl::Mutex stats_mu_;
  std::map<std::string, Stats> stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_INFERENCE_SERVICE_H_
