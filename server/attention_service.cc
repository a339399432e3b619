#include "server/attention_service.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attn/status_macros.h"
#include "server/auth.h"
#include "server/status.h"

namespace attnserve {
namespace {

namespace v1 = ::attention::v1;

attn::Precision PrecisionOf(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_BFLOAT16:
      return attn::Precision::kBFloat16;
    case v1::PRECISION_FLOAT16:
      return attn::Precision::kFloat16;
    default:
      return attn::Precision::kFloat32;
  }
}

absl::Status CheckEnum(absl::string_view field, int value, bool valid) {
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown enum value ", value));
}

absl::Status CheckEncoding(v1::TensorEncoding encoding) {
  return CheckEnum("output_encoding", encoding,
                   v1::TensorEncoding_IsValid(encoding));
}

// The library names the additive weights w_q, w_k, w_v; on the wire they
// are fields of `weights`.
absl::Status WithWireNames(absl::Status status) {
  for (absl::string_view name : {"w_q:", "w_k:", "w_v:"}) {
    if (absl::StartsWith(status.message(), name)) {
      return absl::Status(status.code(),
                          absl::StrCat("weights.", status.message()));
    }
  }
  return status;
}

attn::RegressionKernel KernelOf(v1::RegressionKernel kernel) {
  switch (kernel) {
    case v1::REGRESSION_KERNEL_BOXCAR:
      return attn::RegressionKernel::kBoxcar;
    case v1::REGRESSION_KERNEL_CONSTANT:
      return attn::RegressionKernel::kConstant;
    case v1::REGRESSION_KERNEL_EPANECHNIKOV:
      return attn::RegressionKernel::kEpanechnikov;
    default:
      return attn::RegressionKernel::kGaussian;
  }
}

// Encodes an OpResult's output, and its weights when there are any.
template <typename Response>
void EncodeResult(const attn::OpResult& result, v1::TensorEncoding encoding,
                  Response* response) {
  EncodeTensor(result.output, encoding, response->mutable_output());
  if constexpr (std::is_same_v<Response, v1::AttentionResponse> ||
                std::is_same_v<Response, v1::AdditiveAttentionResponse> ||
                std::is_same_v<Response, v1::NadarayaWatsonResponse>) {
    if (!result.weights.empty()) {
      EncodeTensor(result.weights, encoding, response->mutable_weights());
    }
  }
}

}  // namespace

AttentionService::AttentionService(attn::Engine* engine, WorkerPool* pool,
                                   AttentionBatcher* batcher,
                                   ServiceMetrics* metrics,
                                   const ServiceLimits& limits,
                                   ModelRepository* repository,
                                   Admission* admission)
    : engine_(engine),
      pool_(pool),
      batcher_(batcher),
      metrics_(metrics),
      limits_(limits),
      repository_(repository),
      admission_(admission) {}

class AttentionService::CallReactor final : public grpc::ServerUnaryReactor {
 public:
  void Hold(Admission::Ticket ticket) { ticket_ = std::move(ticket); }
  void OnDone() override { delete this; }
  void OnCancel() override {}

 private:
  Admission::Ticket ticket_;
};

AttentionService::CallReactor* AttentionService::NewReactor(
    absl::Status* refused) const {
  *refused = admission_ != nullptr ? admission_->CheckAccepting()
                                   : absl::OkStatus();
  return new CallReactor();
}

absl::Status AttentionService::AdmitCall(grpc::CallbackServerContext* context,
                                         const ElementBudget& budget,
                                         CallReactor* reactor) const {
  if (admission_ == nullptr) return absl::OkStatus();
  absl::StatusOr<Admission::Ticket> ticket =
      admission_->Admit(context->peer(), 4 * budget.payload_elements());
  if (!ticket.ok()) return ticket.status();
  reactor->Hold(*std::move(ticket));
  return absl::OkStatus();
}

AttentionService::Finish AttentionService::StartCall(
    Rpc rpc, grpc::ServerUnaryReactor* reactor, absl::Time received,
    CallObserver observer, std::shared_ptr<CallRecord> record) {
  metrics_->RequestStarted();
  return [this, rpc, reactor, received, observer = std::move(observer),
          record = std::move(record)](const absl::Status& status) {
    const absl::Duration total = absl::Now() - received;
    metrics_->RequestFinished(rpc, status.code(), total);
    if (observer) observer(status, record ? *record : CallRecord{}, total);
    reactor->Finish(ToGrpcStatus(status));
  };
}

void AttentionService::Complete(
    Rpc rpc, google::protobuf::Message* response, v1::ExecutionInfo* info,
    absl::Time received, absl::Time started, absl::Duration kernel,
    const absl::StatusOr<std::string>& implementation, const Finish& finish,
    CallRecord* record) {
  if (record != nullptr) {
    record->computed = implementation.ok();
    record->queue = started - received;
    record->compute = kernel;
  }
  if (!implementation.ok()) {
    finish(implementation.status());
    return;
  }
  metrics_->KernelRun(rpc, *implementation, kernel);
  if (info != nullptr) {
    info->set_implementation(*implementation);
    info->set_kernel_seconds(absl::ToDoubleSeconds(kernel));
    info->set_queue_seconds(absl::ToDoubleSeconds(started - received));
  }
  const size_t bytes = response->ByteSizeLong();
  if (static_cast<int64_t>(bytes) > limits_.max_response_bytes) {
    response->Clear();
    finish(absl::ResourceExhaustedError(absl::StrCat(
        "the response would be ", bytes, " bytes, over the limit of ",
        limits_.max_response_bytes,
        " (--max_message_bytes); ask for less (e.g. no weights)")));
    return;
  }
  finish(absl::OkStatus());
}

absl::Status AttentionService::CheckResultFits(
    const absl::StatusOr<attn::ResultSize>& size, ElementBudget* budget) const {
  if (!size.ok()) return absl::OkStatus();
  budget->CountResult(size->elements);
  const int64_t bytes = size->elements * int64_t{4};
  if (bytes <= limits_.max_response_bytes) return absl::OkStatus();
  std::string what = absl::StrCat("output ", attn::ShapeToString(size->output_shape));
  if (!size->weights_shape.empty()) {
    absl::StrAppend(&what, " and weights ",
                    attn::ShapeToString(size->weights_shape));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the result (", what, ") would take at least ", bytes,
      " bytes, over the response limit of ", limits_.max_response_bytes,
      " (--max_message_bytes); it was not computed: ask for less (smaller "
      "shapes, no weights)"));
}

grpc::ServerUnaryReactor* AttentionService::Serve(
    Rpc rpc, grpc::CallbackServerContext* context,
    google::protobuf::Message* response, v1::ExecutionInfo* info,
    const Prepare& prepare, CallObserver observer) {
  absl::Status refused;
  CallReactor* reactor = NewReactor(&refused);
  const absl::Time received = absl::Now();
  auto record = std::make_shared<CallRecord>();
  const Finish finish =
      StartCall(rpc, reactor, received, std::move(observer), record);
  // A full queue refuses before decoding: under overload, refusals must
  // not take the workers' CPU.
  if (refused.ok()) refused = pool_->CheckRoom();
  if (!refused.ok()) {
    finish(refused);
    return reactor;
  }
  auto storage = std::make_shared<DecodeStorage>();
  ElementBudget budget(limits_.max_request_elements);
  absl::StatusOr<Work> work = prepare(&budget, storage.get());
  if (work.ok()) {
    if (absl::Status admitted = AdmitCall(context, budget, reactor);
        !admitted.ok()) {
      work = admitted;
    }
  }
  if (!work.ok()) {
    finish(work.status());
    return reactor;
  }
  const absl::Status scheduled = pool_->Schedule(
      [this, rpc, context, response, info, finish, received, storage, record,
       work = *std::move(work)] {
        const absl::Time started = absl::Now();
        metrics_->QueueWait(rpc, started - received);
        if (context->IsCancelled()) {
          finish(absl::CancelledError("the call was cancelled while queued"));
          return;
        }
        if (absl::FromChrono(context->deadline()) <= started) {
          finish(absl::DeadlineExceededError(absl::StrCat(
              "the deadline passed after ",
              absl::FormatDuration(started - received),
              " in the queue; the work was not started")));
          return;
        }
        const absl::StatusOr<std::string> implementation = work();
        Complete(rpc, response, info, received, started,
                 absl::Now() - started, implementation, finish, record.get());
      });
  if (!scheduled.ok()) finish(scheduled);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::MaskedSoftmax(
    grpc::CallbackServerContext* context, const v1::MaskedSoftmaxRequest* request,
    v1::MaskedSoftmaxResponse* response) {
  return Serve(
      Rpc::kMaskedSoftmax, context, response, response->mutable_info(),
      [this, request, response](ElementBudget* budget,
                                DecodeStorage* storage) -> absl::StatusOr<Work> {
        attn::MaskedSoftmaxRequest op;
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ASSIGN_OR_RETURN(op.x, DecodeTensor("x", request->x(), budget, storage));
        ASSIGN_OR_RETURN(op.valid_lens,
                         DecodeLengths("valid_lens", request->valid_lens()));
        RETURN_IF_ERROR(CheckResultFits(attn::SizeOfResult(op), budget));
        return Work([this, op, request, response]() -> absl::StatusOr<std::string> {
          ASSIGN_OR_RETURN(attn::OpResult result, engine_->MaskedSoftmax(op));
          EncodeResult(result, request->output_encoding(), response);
          return result.implementation;
        });
      });
}

grpc::ServerUnaryReactor* AttentionService::BatchMatmul(
    grpc::CallbackServerContext* context, const v1::BatchMatmulRequest* request,
    v1::BatchMatmulResponse* response) {
  return Serve(
      Rpc::kBatchMatmul, context, response, response->mutable_info(),
      [this, request, response](ElementBudget* budget,
                                DecodeStorage* storage) -> absl::StatusOr<Work> {
        attn::BatchMatmulRequest op;
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ASSIGN_OR_RETURN(op.a, DecodeTensor("a", request->a(), budget, storage));
        ASSIGN_OR_RETURN(op.b, DecodeTensor("b", request->b(), budget, storage));
        RETURN_IF_ERROR(CheckEnum("precision", request->precision(),
                                  v1::Precision_IsValid(request->precision())));
        op.precision = PrecisionOf(request->precision());
        RETURN_IF_ERROR(CheckResultFits(attn::SizeOfResult(op), budget));
        return Work([this, op, request, response]() -> absl::StatusOr<std::string> {
          ASSIGN_OR_RETURN(attn::OpResult result, engine_->BatchMatmul(op));
          EncodeResult(result, request->output_encoding(), response);
          return result.implementation;
        });
      });
}

namespace {

absl::StatusOr<attn::AttentionRequest> DecodeAttentionRequest(
    const v1::AttentionRequest& request, ElementBudget* budget,
    DecodeStorage* storage) {
  attn::AttentionRequest op;
  RETURN_IF_ERROR(CheckEncoding(request.output_encoding()));
  ASSIGN_OR_RETURN(op.queries,
                   DecodeTensor("queries", request.queries(), budget, storage));
  ASSIGN_OR_RETURN(op.keys,
                   DecodeTensor("keys", request.keys(), budget, storage));
  ASSIGN_OR_RETURN(op.values,
                   DecodeTensor("values", request.values(), budget, storage));
  ASSIGN_OR_RETURN(op.valid_lens,
                   DecodeLengths("valid_lens", request.valid_lens()));
  RETURN_IF_ERROR(CheckEnum("score", request.score(),
                            v1::Score_IsValid(request.score())));
  RETURN_IF_ERROR(CheckEnum("precision", request.precision(),
                            v1::Precision_IsValid(request.precision())));
  op.causal = request.causal();
  if (request.has_scale()) op.scale = request.scale();
  op.score = request.score() == v1::SCORE_GAUSSIAN
                 ? attn::ScoreKind::kGaussian
                 : attn::ScoreKind::kDotProduct;
  op.return_weights = request.return_weights();
  op.precision = PrecisionOf(request.precision());
  return op;
}

}  // namespace

grpc::ServerUnaryReactor* AttentionService::ScaledDotProductAttention(
    grpc::CallbackServerContext* context, const v1::AttentionRequest* request,
    v1::AttentionResponse* response) {
  return ServeAttention(
      Rpc::kScaledDotProductAttention, context, response,
      response->mutable_info(),
      [request](ElementBudget* budget, DecodeStorage* storage) {
        return DecodeAttentionRequest(*request, budget, storage);
      },
      [request, response](const attn::OpResult& result) {
        EncodeResult(result, request->output_encoding(), response);
      });
}

grpc::ServerUnaryReactor* AttentionService::ServeAttention(
    Rpc rpc, grpc::CallbackServerContext* context,
    google::protobuf::Message* response, v1::ExecutionInfo* info,
    const DecodeAttention& decode, EncodeAttention encode,
    CallObserver observer) {
  if (batcher_ == nullptr) {
    return Serve(rpc, context, response, info,
                 [this, &decode, encode](ElementBudget* budget,
                                         DecodeStorage* storage)
                     -> absl::StatusOr<Work> {
                   ASSIGN_OR_RETURN(attn::AttentionRequest op,
                                    decode(budget, storage));
                   RETURN_IF_ERROR(CheckResultFits(attn::SizeOfResult(op), budget));
                   return Work([this, op, encode]() -> absl::StatusOr<std::string> {
                     ASSIGN_OR_RETURN(attn::OpResult result,
                                      engine_->Attention(op));
                     encode(result);
                     return result.implementation;
                   });
                 },
                 std::move(observer));
  }
  absl::Status refused;
  CallReactor* reactor = NewReactor(&refused);
  const absl::Time received = absl::Now();
  auto record = std::make_shared<CallRecord>();
  const Finish finish =
      StartCall(rpc, reactor, received, std::move(observer), record);
  if (!refused.ok()) {
    finish(refused);
    return reactor;
  }
  auto storage = std::make_shared<DecodeStorage>();
  ElementBudget budget(limits_.max_request_elements);
  absl::StatusOr<attn::AttentionRequest> op = decode(&budget, storage.get());
  if (op.ok()) {
    absl::Status admitted =
        CheckResultFits(attn::SizeOfResult(*op), &budget);
    if (admitted.ok()) admitted = AdmitCall(context, budget, reactor);
    if (!admitted.ok()) op = admitted;
  }
  if (!op.ok()) {
    finish(op.status());
    return reactor;
  }
  auto task = std::make_unique<AttentionBatcher::Task>();
  task->request = *std::move(op);
  task->deadline = absl::FromChrono(context->deadline());
  task->cancelled = [context] { return context->IsCancelled(); };
  task->done = [this, rpc, response, info, encode = std::move(encode), finish,
                received, storage, record](absl::StatusOr<attn::OpResult> result,
                                           const BatchTiming& timing) {
    record->batch_requests = std::max(timing.batch_requests, 1);
    metrics_->QueueWait(rpc, timing.started - received);
    absl::StatusOr<std::string> implementation =
        result.ok() ? absl::StatusOr<std::string>(result->implementation)
                    : absl::StatusOr<std::string>(result.status());
    if (result.ok()) encode(*result);
    Complete(rpc, response, info, received, timing.started, timing.kernel,
             implementation, finish, record.get());
  };
  const absl::Status scheduled = batcher_->Schedule(std::move(task));
  if (!scheduled.ok()) finish(scheduled);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::AdditiveAttention(
    grpc::CallbackServerContext* context,
    const v1::AdditiveAttentionRequest* request,
    v1::AdditiveAttentionResponse* response) {
  return Serve(
      Rpc::kAdditiveAttention, context, response, response->mutable_info(),
      [this, request, response](ElementBudget* budget,
                                DecodeStorage* storage) -> absl::StatusOr<Work> {
        attn::AdditiveAttentionRequest op;
        std::shared_ptr<const RepositoryModel> held;
        if (request->has_weights_name()) {
          held = repository_ == nullptr
                     ? nullptr
                     : repository_->Find(request->weights_name());
          if (held == nullptr || held->config.backend() != "additive_attention") {
            return absl::NotFoundError(absl::StrCat(
                "weights_name: no additive_attention model '",
                request->weights_name(), "' in the model repository"));
          }
          op.w_q = held->tensors.at("W_q").view();
          op.w_k = held->tensors.at("W_k").view();
          op.w_v = held->tensors.at("w_v").view();
        }
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ASSIGN_OR_RETURN(op.queries, DecodeTensor("queries", request->queries(),
                                                  budget, storage));
        ASSIGN_OR_RETURN(op.keys,
                         DecodeTensor("keys", request->keys(), budget, storage));
        ASSIGN_OR_RETURN(op.values, DecodeTensor("values", request->values(),
                                                 budget, storage));
        if (held == nullptr) {
          const v1::AdditiveWeights& weights = request->weights();
          ASSIGN_OR_RETURN(op.w_q, DecodeTensor("weights.w_q", weights.w_q(),
                                                budget, storage));
          ASSIGN_OR_RETURN(op.w_k, DecodeTensor("weights.w_k", weights.w_k(),
                                                budget, storage));
          ASSIGN_OR_RETURN(op.w_v, DecodeTensor("weights.w_v", weights.w_v(),
                                                budget, storage));
        }
        ASSIGN_OR_RETURN(op.valid_lens,
                         DecodeLengths("valid_lens", request->valid_lens()));
        op.return_weights = request->return_weights();
        RETURN_IF_ERROR(CheckResultFits(attn::SizeOfResult(op), budget));
        // `held` keeps repository weights alive while the kernel reads them.
        return Work([this, op, held, request, response]() -> absl::StatusOr<std::string> {
          absl::StatusOr<attn::OpResult> computed =
              engine_->AdditiveAttention(op);
          if (!computed.ok()) return WithWireNames(computed.status());
          const attn::OpResult& result = *computed;
          EncodeResult(result, request->output_encoding(), response);
          return result.implementation;
        });
      });
}

grpc::ServerUnaryReactor* AttentionService::NadarayaWatson(
    grpc::CallbackServerContext* context,
    const v1::NadarayaWatsonRequest* request,
    v1::NadarayaWatsonResponse* response) {
  return Serve(
      Rpc::kNadarayaWatson, context, response, response->mutable_info(),
      [this, request, response](ElementBudget* budget,
                                DecodeStorage* storage) -> absl::StatusOr<Work> {
        attn::NadarayaWatsonRequest op;
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ASSIGN_OR_RETURN(op.x_train, DecodeTensor("x_train", request->x_train(),
                                                  budget, storage));
        ASSIGN_OR_RETURN(op.y_train, DecodeTensor("y_train", request->y_train(),
                                                  budget, storage));
        ASSIGN_OR_RETURN(op.x_query, DecodeTensor("x_query", request->x_query(),
                                                  budget, storage));
        RETURN_IF_ERROR(
            CheckEnum("kernel", request->kernel(),
                      v1::RegressionKernel_IsValid(request->kernel())));
        op.kernel = KernelOf(request->kernel());
        if (request->has_bandwidth()) op.bandwidth = request->bandwidth();
        op.return_weights = request->return_weights();
        RETURN_IF_ERROR(CheckResultFits(attn::SizeOfResult(op), budget));
        return Work([this, op, request, response]() -> absl::StatusOr<std::string> {
          ASSIGN_OR_RETURN(attn::OpResult result, engine_->NadarayaWatson(op));
          EncodeResult(result, request->output_encoding(), response);
          return result.implementation;
        });
      });
}

grpc::ServerUnaryReactor* AttentionService::FitBandwidth(
    grpc::CallbackServerContext* context,
    const v1::FitBandwidthRequest* request,
    v1::FitBandwidthResponse* response) {
  return Serve(
      Rpc::kFitBandwidth, context, response, response->mutable_info(),
      [this, context, request, response](ElementBudget* budget,
                                DecodeStorage* storage) -> absl::StatusOr<Work> {
        attn::FitBandwidthRequest op;
        ASSIGN_OR_RETURN(op.x_train, DecodeTensor("x_train", request->x_train(),
                                                  budget, storage));
        ASSIGN_OR_RETURN(op.y_train, DecodeTensor("y_train", request->y_train(),
                                                  budget, storage));
        if (request->has_initial_bandwidth()) {
          op.initial_bandwidth = request->initial_bandwidth();
        }
        if (request->has_learning_rate()) {
          op.learning_rate = request->learning_rate();
        }
        if (request->has_epochs()) op.epochs = request->epochs();
        // A cancelled call (client, deadline, shutdown) stops the fit at the
        // next epoch instead of holding a worker.
        op.stop_requested = [context] { return context->IsCancelled(); };
        if (!request->save_as().empty() && repository_ == nullptr) {
          return absl::FailedPreconditionError(
              "save_as: the server runs without --model_repository");
        }
        if (!request->save_as().empty() && limits_.save_as_needs_permission &&
            (context->auth_context() == nullptr ||
             context->auth_context()->FindPropertyValues(kSaveAsProperty)
                 .empty())) {
          return absl::PermissionDeniedError(
              "save_as: this token may not write models; give it the "
              "permission save_as in --auth_tokens_file");
        }
        return Work([this, op, request, response]() -> absl::StatusOr<std::string> {
          ASSIGN_OR_RETURN(attn::FitBandwidthResult result,
                           engine_->FitBandwidth(op));
          if (!request->save_as().empty()) {
            RETURN_IF_ERROR(
                repository_->SaveBandwidth(request->save_as(), result.bandwidth));
          }
          response->set_bandwidth(result.bandwidth);
          response->mutable_loss_per_epoch()->Assign(
              result.loss_per_epoch.begin(), result.loss_per_epoch.end());
          response->set_final_loss(result.final_loss);
          return std::string("reference");
        });
      });
}

}  // namespace attnserve
