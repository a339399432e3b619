#include "server/api/inference_service.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/api/auth.h"
#include "server/api/kserve_infer_call.h"
#include "server/api/kserve_metadata.h"
#include "server/api/kserve_statistics.h"
#include "server/api/status.h"
#include "server/api/unary_call.h"

namespace attnserve {
namespace {

// Finishes a call that needs no kernel.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Whether the call's bearer token grants model_control (always false
// without tokens; ModelController asks only when tokens are on).
bool MayControlModels(grpc::CallbackServerContext* context) {
  return context->auth_context() != nullptr &&
         !context->auth_context()
              ->FindPropertyValues(kModelControlProperty)
              .empty();
}

}  // namespace

InferenceService::InferenceService(CallRunner* calls,
                                   ModelRepository* repository,
                                   const BatchingOptions* batching,
                                   int max_batch_size,
                                   const ModelControl& model_control)
    : calls_(calls),
      catalogue_(repository),
      model_controller_(repository, model_control),
      batching_(batching != nullptr),
      batching_options_(batching != nullptr ? *batching : BatchingOptions{}),
      max_batch_size_(max_batch_size) {}

grpc::ServerUnaryReactor* InferenceService::ServerLive(
    grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  response->set_live(true);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  response->set_ready(ready_.load());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  response->set_ready(ready_.load() &&
                      catalogue_.Resolve(request->name(), request->version()).ok());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  DescribeServer(response);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context,
    const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  absl::StatusOr<ResolvedModel> model =
      catalogue_.Resolve(request->name(), request->version());
  if (!model.ok()) return Answer(context, model.status());
  DescribeModel(model->spec, response);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  absl::StatusOr<ResolvedModel> model =
      catalogue_.Resolve(request->name(), request->version());
  if (!model.ok()) return Answer(context, model.status());
  ConfigureModel(*model, max_batch_size_,
                 batching_ ? &batching_options_ : nullptr,
                 response->mutable_config());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context,
    const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  model_controller_.Index(ready_.load(), *request, response);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  return Answer(context, model_controller_.Load(MayControlModels(context), *request));
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  return Answer(context, model_controller_.Unload(MayControlModels(context), *request));
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context,
    const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  std::vector<std::string> names;
  if (request->name().empty()) {
    names = catalogue_.Names();
  } else {
    absl::StatusOr<ResolvedModel> model =
        catalogue_.Resolve(request->name(), request->version());
    if (!model.ok()) return Answer(context, model.status());
    names.push_back(request->name());
  }
  for (const std::string& name : names) {
    ReportModelStatistics(name, calls_->statistics().Get(name),
                          response->add_model_stats());
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(
    grpc::CallbackServerContext* context,
    const inference::ModelInferRequest* request,
    inference::ModelInferResponse* response) {
  auto* reactor = new UnaryCallReactor(response, nullptr,
                                       calls_->limits().max_response_bytes);
  Infer(request, response, ContextOf(context), reactor);
  return reactor;
}

void InferenceService::Infer(const inference::ModelInferRequest* request,
                             inference::ModelInferResponse* response,
                             CallContext context, CallResponder* responder) {
  KServeInferCall::Start(catalogue_, calls_, request, response,
                         std::move(context), responder);
}

}  // namespace attnserve
