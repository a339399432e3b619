// attention.v1.AttentionService on gRPC's callback API: a front end of the
// execution stack (server/execution/call_runner.h).
//
// Each handler decodes and checks the request's tensors on the gRPC thread
// (cheap, and malformed requests never take a queue slot) and hands the call
// to the core, which queues, batches (every operation but FitBandwidth, when
// batching is on), computes on a worker, and answers through the call's
// reactor (server/transport/unary_call.h); the handler returns that reactor at
// once. What the core refuses, and with which status, is said there.
//
// A call naming a stored model (ScaledDotProductAttention's memory_name,
// AdditiveAttention's weights_name, NadarayaWatson's model_name) resolves it
// through the catalogue (server/models/model_catalogue.h), whose kind builds
// the library's request, as for a KServe call on the same model; the call
// counts in that model's statistics. Whether a caller may save a fit
// (FitBandwidth's save_as) or append rows (AppendMemory) is the catalogue's
// to say.
//
// Thread-safe; borrows the core and the catalogue, which must outlive it and
// the gRPC server it is registered with.
#ifndef ATTNSERVE_SERVER_TYPED_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_TYPED_ATTENTION_SERVICE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "attention/v1/attention.grpc.pb.h"
#include "server/typed/tensor_codec.h"
#include "server/transport/unary_call.h"
#include "server/execution/call_runner.h"
#include "server/models/model_catalogue.h"

namespace attnserve {

class AttentionService final
    : public attention::v1::AttentionService::CallbackService {
 public:
  // `catalogue` may be null (as may its repository): weights_name then
  // answers NOT_FOUND and save_as FAILED_PRECONDITION.
  explicit AttentionService(CallRunner* calls,
                            ModelCatalogue* catalogue = nullptr);

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
  // Runs on the gRPC thread, as a KServe load does: it blocks on file I/O
  // (two fsyncs) and never takes a worker from the kernels.
  grpc::ServerUnaryReactor* AppendMemory(
      grpc::CallbackServerContext* context,
      const attention::v1::AppendMemoryRequest* request,
      attention::v1::AppendMemoryResponse* response) override;
  // On the gRPC thread, as AppendMemory.
  grpc::ServerUnaryReactor* EvictMemory(
      grpc::CallbackServerContext* context,
      const attention::v1::EvictMemoryRequest* request,
      attention::v1::EvictMemoryResponse* response) override;


 private:
  // The decode step of a typed call, on the gRPC thread: checks the request
  // and returns the core's Work. Views it makes may point into `storage`,
  // which lives as long as the Work.
  using DecodeTypedCall = std::function<absl::StatusOr<CallRunner::Work>(
      ElementBudget*, DecodeStorage*)>;
  // Makes a new call's reactor (*reactor) and its context with the request
  // metadata applied (*call). False when the metadata is invalid: the
  // reactor has then answered INVALID_ARGUMENT (counted under `operation`).
  bool BeginCall(Operation operation, grpc::CallbackServerContext* context,
                 google::protobuf::Message* response,
                 attention::v1::ExecutionInfo* info,
                 UnaryCallReactor** reactor, CallContext* call) const;
  // The decode step of a batchable operation's call, on the gRPC thread;
  // views it makes may point into `storage`, which lives until the kernel
  // has run.
  using DecodeTypedOp = std::function<absl::StatusOr<OperationRequest>(
      ElementBudget*, DecodeStorage*)>;
  // Fills the response from the result (on a worker).
  using EncodeWith = std::function<void(const attn::OpResult&)>;
  // What a call of a batchable operation is, beyond its decode and encode
  // steps.
  struct OpOptions {
    // The library's argument names in its errors, as the wire names them.
    CallRunner::WireNames wire_names;
    // The stored model the call counts in (empty: none), and whether its
    // kind's calls are batched by default (ModelKind::gains_from_batching).
    std::string model;
    bool gains_from_batching = false;
  };
  // The options of a call naming a stored model `name`, as the catalogue
  // resolved it: the call counts in the model's statistics.
  static OpOptions ForStoredModel(const ServedModel& model,
                                  const std::string& name);
  // Hands one call of a batchable operation to the core (which may batch
  // it) and returns its reactor.
  grpc::ServerUnaryReactor* ServeOp(Operation operation,
                                    grpc::CallbackServerContext* context,
                                    google::protobuf::Message* response,
                                    attention::v1::ExecutionInfo* info,
                                    const DecodeTypedOp& decode,
                                    EncodeWith encode, OpOptions options);
  // Answers a call naming a model the catalogue cannot resolve with
  // `status` (NOT_FOUND), counted as KServe counts an unknown model: under
  // rpc="unresolved", never handed over.
  grpc::ServerUnaryReactor* RefuseUnresolved(
      Operation operation, grpc::CallbackServerContext* context,
      google::protobuf::Message* response, attention::v1::ExecutionInfo* info,
      const absl::Status& status);
  // Hands one call to the core and returns its reactor.
  grpc::ServerUnaryReactor* Serve(Operation operation, grpc::CallbackServerContext* context,
                                  google::protobuf::Message* response,
                                  attention::v1::ExecutionInfo* info,
                                  const DecodeTypedCall& prepare);

  CallRunner* const calls_;
  // The built-in models only: the catalogue when none is given.
  ModelCatalogue no_models_{nullptr};
  ModelCatalogue* const catalogue_;  // never null
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TYPED_ATTENTION_SERVICE_H_
