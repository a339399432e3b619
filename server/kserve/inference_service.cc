#include "server/kserve/inference_service.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/transport/auth.h"
#include "server/kserve/infer_call.h"
#include "server/kserve/metadata.h"
#include "server/kserve/model_control.h"
#include "server/kserve/statistics.h"
#include "server/transport/status.h"
#include "server/transport/unary_call.h"

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
// without tokens; the catalogue asks only when tokens are on).
bool MayControlModels(grpc::CallbackServerContext* context) {
  return context->auth_context() != nullptr &&
         !context->auth_context()
              ->FindPropertyValues(kModelControlProperty)
              .empty();
}

}  // namespace

InferenceService::InferenceService(ExecutionStack* stack,
                                   ModelCatalogue* catalogue,
                                   int max_batch_size)
    : stack_(stack),
      calls_(&stack->calls()),
      catalogue_(catalogue),
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
  response->set_ready(stack_->ready());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  response->set_ready(stack_->ready() &&
                      catalogue_->Resolve(request->name(), request->version()).ok());
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
  absl::StatusOr<ServedModel> model =
      catalogue_->Resolve(request->name(), request->version());
  if (!model.ok()) return Answer(context, model.status());
  DescribeModel(model->signature, response);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  absl::StatusOr<ServedModel> model =
      catalogue_->Resolve(request->name(), request->version());
  if (!model.ok()) return Answer(context, model.status());
  ConfigureModel(*model, max_batch_size_,
                 stack_->batching(),
                 response->mutable_config());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context,
    const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  EncodeIndex(catalogue_->Index(stack_->ready(), request->ready()), response);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  // The request is this call's alone until it is answered, and gRPC made it
  // mutable: an upload's bytes are moved out of it, not copied (an upload
  // costs the message and nothing more).
  auto* mutable_request =
      const_cast<inference::RepositoryModelLoadRequest*>(request);
  return Answer(context, LoadModel(*catalogue_, MayControlModels(context),
                                   request->model_name(),
                                   mutable_request->mutable_parameters()));
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  return Answer(context, catalogue_->Unload(
                             MayControlModels(context), request->model_name(),
                             ParameterNames(request->parameters())));
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context,
    const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  std::vector<std::string> names;
  if (request->name().empty()) {
    names = catalogue_->Names();
  } else {
    absl::StatusOr<ServedModel> model =
        catalogue_->Resolve(request->name(), request->version());
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
  KServeInferCall::Start(*catalogue_, calls_, request, response,
                         std::move(context), responder);
}

}  // namespace attnserve
