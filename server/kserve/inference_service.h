// The KServe v2 / Open Inference Protocol gRPC service
// (inference.GRPCInferenceService), with the Triton extensions its tools
// need (ModelConfig, ModelStatistics, ModelStreamInfer, the model
// repository's index, load and unload), on the same port as attention.v1.
// A thin front end: each handler delegates to the concept it serves.
//
// - The models (server/models/model_catalogue.h): the built-in models, one
//   per operation with fixed tensor names, and every stored model of the
//   repository (see docs/kserve.md, "The models"). Each model has a kind
//   (server/models/model_kinds.h, which lists them) that builds its
//   operation and names its results: nothing here knows one kind from
//   another.
// - Inference (server/kserve/infer_call.h, with the tensor codec in
//   server/kserve/codec.h and the request parameters in
//   server/kserve/parameters.h): inputs come as raw_input_contents or
//   typed contents (FP32; INT32 or INT64 for valid_lens); outputs always go
//   back as raw_output_contents, one per output in order.
//   attention_weights are computed only when requested by name. Inference
//   is a front end of the execution stack (server/execution/call_runner.h), like
//   the typed API: the same pool, batcher, limits and metrics. With
//   batching on, the calls of every model (every built-in model and every
//   repository model) go through the batcher, batched on their first
//   dimension; only the configs differ (below). The HTTP/REST front end
//   (server/kserve/rest_service.h) runs its requests through the same
//   KServeInferCall.
// - ServerMetadata, ModelMetadata and ModelConfig
//   (server/kserve/metadata.h); the repository's index, load and
//   unload (the catalogue's, encoded by server/kserve/model_control.h);
//   ModelStatistics, the core's per-model counts
//   (server/kserve/statistics.h).
//
// Thread-safe; borrows the execution stack and the catalogue, which must
// outlive it.
#ifndef ATTNSERVE_SERVER_KSERVE_INFERENCE_SERVICE_H_
#define ATTNSERVE_SERVER_KSERVE_INFERENCE_SERVICE_H_

#include <string>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"
#include "server/execution/call_runner.h"
#include "server/execution/execution_stack.h"
#include "server/models/model_catalogue.h"

namespace attnserve {

class InferenceService final
    : public inference::GRPCInferenceService::CallbackService {
 public:
  // Batching (the stack's) covers every model; what ModelConfig reports
  // does not: only the model whose config declares a batch dimension,
  // dot_product_attention, reports `max_batch_size` and, when the stack
  // batches, the batcher's options as dynamic_batching (see
  // server/kserve/metadata.h). Every other model reports max_batch_size 0
  // and no dynamic_batching, so that the shapes Triton's tools see are
  // unchanged, though the batcher batches its calls too. ServerReady and
  // ModelReady report the stack's readiness.
  InferenceService(ExecutionStack* stack, ModelCatalogue* catalogue,
                   int max_batch_size);

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
  // Triton's streaming inference (server/kserve/inference_stream.cc): each
  // request read is a call of its own through the core, as ModelInfer's;
  // each answer is written as it completes (out of order), with its
  // request's id, and an error goes in error_message without ending the
  // stream.
  grpc::ServerBidiReactor<inference::ModelInferRequest,
                          inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;

 private:
  class StreamReactor;

  // Starts one inference of ModelInfer or ModelStreamInfer
  // (KServeInferCall::Start): `responder` answers it, at once for an
  // unknown model or a malformed request. `request` and `response` must
  // live until then.
  void Infer(const inference::ModelInferRequest* request,
             inference::ModelInferResponse* response, CallContext context,
             CallResponder* responder);

  ExecutionStack* const stack_;
  CallRunner* const calls_;
  ModelCatalogue* const catalogue_;
  const int max_batch_size_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_INFERENCE_SERVICE_H_
