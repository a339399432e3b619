#include "server/typed/attention_service.h"

#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attn/status_macros.h"
#include "server/transport/auth.h"
#include "server/transport/status.h"
#include "server/transport/unary_call.h"
#include "server/models/model_kinds.h"

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

AttentionService::AttentionService(CallRunner* calls,
                                   ModelCatalogue* catalogue)
    : calls_(calls), catalogue_(catalogue != nullptr ? catalogue : &no_models_) {}

bool AttentionService::BeginCall(Operation operation,
                                 grpc::CallbackServerContext* context,
                                 google::protobuf::Message* response,
                                 v1::ExecutionInfo* info,
                                 UnaryCallReactor** reactor,
                                 CallContext* call) const {
  *reactor = new UnaryCallReactor(
      response,
      [info](const CallRecord& record) {
        info->set_implementation(record.implementation);
        info->set_kernel_seconds(absl::ToDoubleSeconds(record.compute));
        info->set_queue_seconds(absl::ToDoubleSeconds(record.queue));
      },
      calls_->limits().max_response_bytes);
  *call = ContextOf(context);
  if (absl::Status metadata = ApplyCallMetadata(context, call); !metadata.ok()) {
    calls_->Refuse(operation, *call, metadata, *reactor);
    return false;
  }
  return true;
}

grpc::ServerUnaryReactor* AttentionService::Serve(
    Operation operation, grpc::CallbackServerContext* context,
    google::protobuf::Message* response, v1::ExecutionInfo* info,
    const DecodeTypedCall& prepare) {
  CallContext call;
  UnaryCallReactor* reactor = nullptr;
  if (!BeginCall(operation, context, response, info, &reactor, &call)) {
    return reactor;
  }
  auto storage = std::make_shared<DecodeStorage>();
  calls_->Run(operation, call,
              [&prepare, storage](ElementBudget* budget)
                  -> absl::StatusOr<CallRunner::Work> {
                ASSIGN_OR_RETURN(CallRunner::Work work,
                                 prepare(budget, storage.get()));
                // The decoded views point into `storage`: it lives as long
                // as the work.
                return CallRunner::Work(
                    [work = std::move(work), storage] { return work(); });
              },
              reactor);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::ServeOp(
    Operation operation, grpc::CallbackServerContext* context,
    google::protobuf::Message* response, v1::ExecutionInfo* info,
    const DecodeTypedOp& decode, EncodeWith encode, OpOptions options) {
  CallContext call;
  UnaryCallReactor* reactor = nullptr;
  if (!BeginCall(operation, context, response, info, &reactor, &call)) {
    return reactor;
  }
  call.model = std::move(options.model);
  call.gains_from_batching = options.gains_from_batching;
  // The decoded views point into `storage`: the encoding step, which the
  // core keeps until the kernel has run, holds it.
  auto storage = std::make_shared<DecodeStorage>();
  calls_->RunOp(
      operation, call,
      [&decode, storage](ElementBudget* budget) {
        return decode(budget, storage.get());
      },
      [encode = std::move(encode), storage](const attn::OpResult& result) {
        encode(result);
      },
      std::move(options.wire_names), reactor);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::RefuseUnresolved(
    Operation operation, grpc::CallbackServerContext* context,
    google::protobuf::Message* response, v1::ExecutionInfo* info,
    const absl::Status& status) {
  CallContext call;
  UnaryCallReactor* reactor = nullptr;
  if (BeginCall(operation, context, response, info, &reactor, &call)) {
    calls_->Refuse(std::nullopt, call, status, reactor);
  }
  return reactor;
}

AttentionService::OpOptions AttentionService::ForStoredModel(
    const ServedModel& model, const std::string& name) {
  OpOptions options;
  options.model = name;
  options.gains_from_batching = model.kind->gains_from_batching;
  return options;
}

grpc::ServerUnaryReactor* AttentionService::MaskedSoftmax(
    grpc::CallbackServerContext* context, const v1::MaskedSoftmaxRequest* request,
    v1::MaskedSoftmaxResponse* response) {
  return ServeOp(
      Operation::kMaskedSoftmax, context, response, response->mutable_info(),
      [request](ElementBudget* budget,
                DecodeStorage* storage) -> absl::StatusOr<OperationRequest> {
        attn::MaskedSoftmaxRequest op;
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ASSIGN_OR_RETURN(op.x, DecodeTensor("x", request->x(), budget, storage));
        ASSIGN_OR_RETURN(op.valid_lens,
                         DecodeLengths("valid_lens", request->valid_lens()));
        return op;
      },
      [request, response](const attn::OpResult& result) {
        EncodeResult(result, request->output_encoding(), response);
      },
      OpOptions());
}

grpc::ServerUnaryReactor* AttentionService::BatchMatmul(
    grpc::CallbackServerContext* context, const v1::BatchMatmulRequest* request,
    v1::BatchMatmulResponse* response) {
  return ServeOp(
      Operation::kBatchMatmul, context, response, response->mutable_info(),
      [request](ElementBudget* budget,
                DecodeStorage* storage) -> absl::StatusOr<OperationRequest> {
        attn::BatchMatmulRequest op;
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ASSIGN_OR_RETURN(op.a, DecodeTensor("a", request->a(), budget, storage));
        ASSIGN_OR_RETURN(op.b, DecodeTensor("b", request->b(), budget, storage));
        RETURN_IF_ERROR(CheckEnum("precision", request->precision(),
                                  v1::Precision_IsValid(request->precision())));
        op.precision = PrecisionOf(request->precision());
        return op;
      },
      [request, response](const attn::OpResult& result) {
        EncodeResult(result, request->output_encoding(), response);
      },
      OpOptions());
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
  if (request->memory_name().empty()) {
    return ServeOp(
        Operation::kScaledDotProductAttention, context, response,
        response->mutable_info(),
        [request](ElementBudget* budget,
                  DecodeStorage* storage) -> absl::StatusOr<OperationRequest> {
          return DecodeAttentionRequest(*request, budget, storage);
        },
        [request, response](const attn::OpResult& result) {
          EncodeResult(result, request->output_encoding(), response);
        },
        OpOptions());
  }
  // Queries against a stored memory: its kind builds the request, as for a
  // KServe call on the same model; the encoding step holds the memory until
  // the kernel has run, and the call counts in the model's statistics.
  absl::StatusOr<ServedModel> memory = catalogue_->ResolveStored(
      "memory_name", request->memory_name(), AttentionMemoryKind());
  if (!memory.ok()) {
    return RefuseUnresolved(Operation::kScaledDotProductAttention, context,
                            response, response->mutable_info(),
                            memory.status());
  }
  std::shared_ptr<const RepositoryModel> held = memory->stored;
  return ServeOp(
      Operation::kScaledDotProductAttention, context, response,
      response->mutable_info(),
      [request, memory](ElementBudget* budget, DecodeStorage* storage)
          -> absl::StatusOr<OperationRequest> {
        for (const auto& [set, field] :
             {std::pair<bool, const char*>{request->has_keys(), "keys"},
              {request->has_values(), "values"},
              {request->has_valid_lens(), "valid_lens"},
              {request->causal(), "causal"},
              {request->has_scale(), "scale"},
              {request->score() != v1::SCORE_DOT_PRODUCT, "score"}}) {
          if (set) {
            return absl::InvalidArgumentError(absl::StrCat(
                field, ": model '", request->memory_name(),
                "' holds the keys and values, and its score and scale; "
                "leave ", field, " unset with memory_name"));
          }
        }
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        RETURN_IF_ERROR(CheckEnum("precision", request->precision(),
                                  v1::Precision_IsValid(request->precision())));
        ModelInputs inputs;
        ASSIGN_OR_RETURN(inputs.floats["queries"],
                         DecodeTensor("queries", request->queries(), budget,
                                      storage));
        KindArguments arguments{request->memory_name(), ModelParameters{},
                                inputs, memory->stored.get(),
                                request->return_weights()};
        arguments.precision = PrecisionOf(request->precision());
        return memory->kind->build_request(arguments);
      },
      [request, response, held](const attn::OpResult& result) {
        EncodeResult(result, request->output_encoding(), response);
      },
      ForStoredModel(*memory, request->memory_name()));
}

grpc::ServerUnaryReactor* AttentionService::AdditiveAttention(
    grpc::CallbackServerContext* context,
    const v1::AdditiveAttentionRequest* request,
    v1::AdditiveAttentionResponse* response) {
  if (!request->has_weights_name()) {
    return ServeOp(
        Operation::kAdditiveAttention, context, response,
        response->mutable_info(),
        [request](ElementBudget* budget,
                  DecodeStorage* storage) -> absl::StatusOr<OperationRequest> {
          attn::AdditiveAttentionRequest op;
          RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
          ASSIGN_OR_RETURN(op.queries, DecodeTensor("queries",
                                                    request->queries(), budget,
                                                    storage));
          ASSIGN_OR_RETURN(op.keys, DecodeTensor("keys", request->keys(),
                                                 budget, storage));
          ASSIGN_OR_RETURN(op.values, DecodeTensor("values", request->values(),
                                                   budget, storage));
          const v1::AdditiveWeights& weights = request->weights();
          ASSIGN_OR_RETURN(op.w_q, DecodeTensor("weights.w_q", weights.w_q(),
                                                budget, storage));
          ASSIGN_OR_RETURN(op.w_k, DecodeTensor("weights.w_k", weights.w_k(),
                                                budget, storage));
          ASSIGN_OR_RETURN(op.w_v, DecodeTensor("weights.w_v", weights.w_v(),
                                                budget, storage));
          ASSIGN_OR_RETURN(op.valid_lens,
                           DecodeLengths("valid_lens", request->valid_lens()));
          op.return_weights = request->return_weights();
          return op;
        },
        [request, response](const attn::OpResult& result) {
          EncodeResult(result, request->output_encoding(), response);
        },
        OpOptions{WithWireNames, /*model=*/"", /*gains_from_batching=*/false});
  }
  // A stored model's weights: its kind builds the request, as for a KServe
  // call on the same model; the encoding step keeps the weights alive while
  // the kernel reads them, even if the model is unloaded meanwhile, and the
  // call counts in the model's statistics.
  absl::StatusOr<ServedModel> stored = catalogue_->ResolveStored(
      "weights_name", request->weights_name(), AdditiveAttentionKind());
  if (!stored.ok()) {
    return RefuseUnresolved(Operation::kAdditiveAttention, context, response,
                            response->mutable_info(), stored.status());
  }
  std::shared_ptr<const RepositoryModel> held = stored->stored;
  OpOptions options =
      ForStoredModel(*stored, request->weights_name());
  options.wire_names = WithWireNames;
  return ServeOp(
      Operation::kAdditiveAttention, context, response, response->mutable_info(),
      [request, stored](ElementBudget* budget,
                        DecodeStorage* storage) -> absl::StatusOr<OperationRequest> {
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        ModelInputs inputs;
        ASSIGN_OR_RETURN(inputs.floats["queries"],
                         DecodeTensor("queries", request->queries(), budget,
                                      storage));
        ASSIGN_OR_RETURN(inputs.floats["keys"],
                         DecodeTensor("keys", request->keys(), budget, storage));
        ASSIGN_OR_RETURN(inputs.floats["values"],
                         DecodeTensor("values", request->values(), budget,
                                      storage));
        ASSIGN_OR_RETURN(inputs.lengths["valid_lens"],
                         DecodeLengths("valid_lens", request->valid_lens()));
        return stored->kind->build_request(
            KindArguments{request->weights_name(), ModelParameters{}, inputs,
                          stored->stored.get(), request->return_weights()});
      },
      [request, response, held](const attn::OpResult& result) {
        EncodeResult(result, request->output_encoding(), response);
      },
      std::move(options));
}

grpc::ServerUnaryReactor* AttentionService::NadarayaWatson(
    grpc::CallbackServerContext* context,
    const v1::NadarayaWatsonRequest* request,
    v1::NadarayaWatsonResponse* response) {
  if (request->model_name().empty()) {
    return ServeOp(
        Operation::kNadarayaWatson, context, response, response->mutable_info(),
        [request](ElementBudget* budget,
                  DecodeStorage* storage) -> absl::StatusOr<OperationRequest> {
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
          return op;
        },
        [request, response](const attn::OpResult& result) {
          EncodeResult(result, request->output_encoding(), response);
        },
        OpOptions());
  }
  // A stored model: its kind builds the request, as for a KServe call on
  // the same model; the encoding step holds the model until the kernel has
  // run, and the call counts in the model's statistics.
  absl::StatusOr<ServedModel> model = catalogue_->ResolveStored(
      "model_name", request->model_name(), FittedNadarayaWatsonKind());
  if (!model.ok()) {
    return RefuseUnresolved(Operation::kNadarayaWatson, context, response,
                            response->mutable_info(), model.status());
  }
  std::shared_ptr<const RepositoryModel> held = model->stored;
  return ServeOp(
      Operation::kNadarayaWatson, context, response, response->mutable_info(),
      [request, model](ElementBudget* budget, DecodeStorage* storage)
          -> absl::StatusOr<OperationRequest> {
        const bool holds_set = model->kind == &TrainedNadarayaWatsonKind();
        for (const auto& [set, field, holding] :
             {std::tuple<bool, const char*, const char*>{
                  request->has_bandwidth(), "bandwidth", "its fitted bandwidth"},
              {holds_set && request->has_x_train(), "x_train",
               "its training set"},
              {holds_set && request->has_y_train(), "y_train",
               "its training set"}}) {
          if (set) {
            return absl::InvalidArgumentError(absl::StrCat(
                field, ": model '", request->model_name(), "' holds ", holding,
                "; leave ", field, " unset with model_name"));
          }
        }
        RETURN_IF_ERROR(CheckEncoding(request->output_encoding()));
        RETURN_IF_ERROR(
            CheckEnum("kernel", request->kernel(),
                      v1::RegressionKernel_IsValid(request->kernel())));
        ModelInputs inputs;
        ASSIGN_OR_RETURN(inputs.floats["x_query"],
                         DecodeTensor("x_query", request->x_query(), budget,
                                      storage));
        if (!holds_set) {
          ASSIGN_OR_RETURN(inputs.floats["x_train"],
                           DecodeTensor("x_train", request->x_train(), budget,
                                        storage));
          ASSIGN_OR_RETURN(inputs.floats["y_train"],
                           DecodeTensor("y_train", request->y_train(), budget,
                                        storage));
        }
        // A kernel other than the default is the call's, as KServe's
        // 'kernel' parameter: the kind refuses it for a model that sets
        // its own.
        ModelParameters parameters;
        if (request->kernel() != v1::REGRESSION_KERNEL_GAUSSIAN) {
          parameters["kernel"] =
              attn::RegressionKernelName(KernelOf(request->kernel()));
        }
        return model->kind->build_request(
            KindArguments{request->model_name(), parameters, inputs,
                          model->stored.get(), request->return_weights()});
      },
      [request, response, held](const attn::OpResult& result) {
        EncodeResult(result, request->output_encoding(), response);
      },
      ForStoredModel(*model, request->model_name()));
}

grpc::ServerUnaryReactor* AttentionService::FitBandwidth(
    grpc::CallbackServerContext* context,
    const v1::FitBandwidthRequest* request,
    v1::FitBandwidthResponse* response) {
  return Serve(
      Operation::kFitBandwidth, context, response, response->mutable_info(),
      [this, context, request, response](ElementBudget* budget,
                                DecodeStorage* storage) -> absl::StatusOr<CallRunner::Work> {
        attn::FitBandwidthRequest op;
        // A refit of a stored model runs on its training set as served now,
        // held until the fit ends.
        std::shared_ptr<const RepositoryModel> stored;
        const std::string& refit = request->model_name();
        if (!refit.empty()) {
          for (const auto& [set, field] :
               {std::pair<bool, const char*>{request->has_x_train(), "x_train"},
                {request->has_y_train(), "y_train"},
                {!request->save_as().empty(), "save_as"}}) {
            if (set) {
              return absl::InvalidArgumentError(absl::StrCat(
                  field, ": leave it unset with model_name: the fit runs on "
                  "the training set of model '", refit, "' and saves into it"));
            }
          }
          ASSIGN_OR_RETURN(ServedModel model,
                           catalogue_->ResolveStored(
                               "model_name", refit, FittedNadarayaWatsonKind()));
          if (model.kind != &TrainedNadarayaWatsonKind()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "model_name: model '", refit, "' holds a bandwidth only, no "
                "training set to fit on; send x_train and y_train"));
          }
          stored = std::move(model.stored);
          op.x_train = stored->tensors.at("x_train").view();
          op.y_train = stored->tensors.at("y_train").view();
        } else {
          ASSIGN_OR_RETURN(op.x_train, DecodeTensor("x_train", request->x_train(),
                                                    budget, storage));
          ASSIGN_OR_RETURN(op.y_train, DecodeTensor("y_train", request->y_train(),
                                                    budget, storage));
        }
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
        const std::string& saved_as =
            refit.empty() ? request->save_as() : refit;
        if (!saved_as.empty()) {
          const bool may_save =
              context->auth_context() != nullptr &&
              !context->auth_context()->FindPropertyValues(kSaveAsProperty)
                   .empty();
          RETURN_IF_ERROR(catalogue_->CheckSaveAllowed(may_save, saved_as));
        }
        return CallRunner::Work([this, op, request, response, stored,
                                 refit]() -> absl::StatusOr<std::string> {
          ASSIGN_OR_RETURN(attn::FitBandwidthResult result,
                           calls_->engine()->FitBandwidth(op));
          // The repository's code stands (RESOURCE_EXHAUSTED: disk full;
          // FAILED_PRECONDITION: read-only); the fit is not lost with it.
          absl::Status saved;
          if (!refit.empty()) {
            saved = catalogue_->SaveRefittedBandwidth(refit, result.bandwidth);
          } else if (!request->save_as().empty()) {
            saved = catalogue_->SaveFittedModel(
                request->save_as(), result.bandwidth, op.x_train, op.y_train);
          }
          if (!saved.ok()) {
            return absl::Status(saved.code(),
                                absl::StrCat(saved.message(),
                                             "; the fit itself finished: "
                                             "bandwidth ", result.bandwidth));
          }
          response->set_bandwidth(result.bandwidth);
          response->mutable_loss_per_epoch()->Assign(
              result.loss_per_epoch.begin(), result.loss_per_epoch.end());
          response->set_final_loss(result.final_loss);
          return std::string("reference");
        });
      });
}

grpc::ServerUnaryReactor* AttentionService::AppendMemory(
    grpc::CallbackServerContext* context,
    const v1::AppendMemoryRequest* request,
    v1::AppendMemoryResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = [&]() -> absl::Status {
    const bool may_append =
        context->auth_context() != nullptr &&
        !context->auth_context()->FindPropertyValues(kAppendProperty).empty();
    RETURN_IF_ERROR(catalogue_->CheckAppendAllowed(may_append, request->name()));
    // The message size limit bounds the rows; the model's, its total.
    ElementBudget budget(std::numeric_limits<int64_t>::max());
    DecodeStorage storage;
    ASSIGN_OR_RETURN(const attn::TensorView keys,
                     DecodeTensor("keys", request->keys(), &budget, &storage));
    ASSIGN_OR_RETURN(const attn::TensorView values,
                     DecodeTensor("values", request->values(), &budget,
                                  &storage));
    std::optional<MemorySettings> create;
    if (request->has_create()) {
      const v1::MemoryCreation& given = request->create();
      RETURN_IF_ERROR(CheckEnum("create.score", given.score(),
                                v1::Score_IsValid(given.score())));
      RETURN_IF_ERROR(CheckEnum("create.precision", given.precision(),
                                v1::Precision_IsValid(given.precision())));
      if (given.precision() == v1::PRECISION_FLOAT16) {
        return absl::InvalidArgumentError(
            "create.precision: a memory stores float32 or bfloat16 rows, "
            "not float16");
      }
      create.emplace();
      create->score = given.score() == v1::SCORE_GAUSSIAN
                          ? attn::ScoreKind::kGaussian
                          : attn::ScoreKind::kDotProduct;
      if (given.has_scale()) create->scale = given.scale();
      create->bfloat16 = given.precision() == v1::PRECISION_BFLOAT16;
      create->max_rows = given.max_rows();
    }
    ASSIGN_OR_RETURN(const ModelRepository::Appended appended,
                     catalogue_->Append(may_append, request->name(), keys,
                                        values, create));
    response->set_first_row(appended.first_row);
    response->set_rows(appended.rows);
    response->set_files(appended.files);
    response->set_evicted(appended.evicted);
    return absl::OkStatus();
  }();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::EvictMemory(
    grpc::CallbackServerContext* context,
    const v1::EvictMemoryRequest* request,
    v1::EvictMemoryResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool may_append =
      context->auth_context() != nullptr &&
      !context->auth_context()->FindPropertyValues(kAppendProperty).empty();
  absl::StatusOr<ModelRepository::Evicted> evicted =
      catalogue_->Evict(may_append, request->name(), request->oldest());
  if (evicted.ok()) {
    response->set_evicted(evicted->evicted);
    response->set_rows(evicted->rows);
  }
  reactor->Finish(ToGrpcStatus(evicted.status()));
  return reactor;
}

}  // namespace attnserve
