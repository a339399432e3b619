#include "server/api/kserve_model_control.h"

#include "absl/strings/str_cat.h"
#include "server/api/auth.h"
#include "server/api/kserve_model_spec.h"
#include "server/api/kserve_models.h"

namespace attnserve {
namespace {

// Parameters Triton's clients send that mean nothing here; others (a
// config override, model files) are refused rather than ignored.
absl::Status CheckControlParameters(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>&
        parameters) {
  for (const auto& [name, value] : parameters) {
    if (name == "unload_dependents") continue;  // no model depends on another
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name,
        "': not supported; put the model's config.pbtxt and "
        "weights.safetensors in its repository folder and load it by name"));
  }
  return absl::OkStatus();
}

}  // namespace

void ModelController::Index(bool server_ready,
                            const inference::RepositoryIndexRequest& request,
                            inference::RepositoryIndexResponse* response) const {
  auto add = [&](const std::string& name, const std::string& state,
                 const std::string& reason) {
    if (request.ready() && state != "READY") return;
    auto* index = response->add_models();
    index->set_name(name);
    index->set_version(kServedModelVersion);
    index->set_state(state);
    index->set_reason(reason);
  };
  for (const KServeModelSpec& model : BuiltInModelSpecs()) {
    add(model.name, server_ready ? "READY" : "UNAVAILABLE",
        server_ready ? "" : "the server is draining");
  }
  if (repository_ != nullptr) {
    for (const ModelRepository::ModelState& model : repository_->Index()) {
      const bool serving = model.state == "READY";
      add(model.name, serving && !server_ready ? "UNAVAILABLE" : model.state,
          serving && !server_ready ? "the server is draining" : model.reason);
    }
  }
}

absl::Status ModelController::CheckAllowed(
    bool may_control_models, const std::string& model_name) const {
  if (!control_.explicit_mode) {
    return absl::FailedPreconditionError(
        "model control is off: start the server with "
        "--model_control_mode=explicit to load and unload models");
  }
  if (control_.needs_permission && !may_control_models) {
    return absl::PermissionDeniedError(
        "this token may not load or unload models; give it the permission "
        "model_control in --auth_tokens_file");
  }
  if (repository_ == nullptr) {
    return absl::FailedPreconditionError(
        "the server runs without --model_repository");
  }
  if (model_name.empty()) {
    return absl::InvalidArgumentError("model_name: empty");
  }
  return absl::OkStatus();
}

absl::Status ModelController::Load(
    bool may_control_models,
    const inference::RepositoryModelLoadRequest& request) {
  absl::Status status = CheckAllowed(may_control_models, request.model_name());
  if (status.ok()) status = CheckControlParameters(request.parameters());
  if (status.ok() && !IsBuiltInModel(request.model_name())) {
    status = repository_->LoadModel(request.model_name());
  }
  return status;
}

absl::Status ModelController::Unload(
    bool may_control_models,
    const inference::RepositoryModelUnloadRequest& request) {
  absl::Status status = CheckAllowed(may_control_models, request.model_name());
  if (status.ok()) status = CheckControlParameters(request.parameters());
  if (status.ok() && IsBuiltInModel(request.model_name())) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "model_name: '", request.model_name(),
        "' is built in and always served"));
  }
  if (status.ok()) status = repository_->UnloadModel(request.model_name());
  return status;
}

}  // namespace attnserve
