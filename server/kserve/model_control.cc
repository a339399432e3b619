#include "server/kserve/model_control.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

#include "server/models/model_kind.h"

namespace attnserve {

std::vector<std::string> ParameterNames(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>&
        parameters) {
  std::vector<std::string> names;
  for (const auto& [name, value] : parameters) names.push_back(name);
  return names;
}

namespace {

// The model a load's parameters upload, if they carry one; its files'
// bytes are moved out of them.
absl::StatusOr<std::optional<ModelUpload>> UploadOf(
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>*
        parameters) {
  std::optional<ModelUpload> upload;
  for (auto& [name, value] : *parameters) {
    if (name == "config") {
      if (value.parameter_choice_case() !=
          inference::ModelRepositoryParameter::kStringParam) {
        return absl::InvalidArgumentError(
            "parameter 'config': must be a string (the model's config as "
            "JSON)");
      }
      if (!upload) upload.emplace();
      upload->config_json = value.string_param();
    } else if (absl::StartsWith(name, "file:")) {
      if (!upload) upload.emplace();
      std::string& bytes = upload->files[name];
      if (value.parameter_choice_case() ==
          inference::ModelRepositoryParameter::kBytesParam) {
        bytes = std::move(*value.mutable_bytes_param());
      } else if (value.parameter_choice_case() !=
                     inference::ModelRepositoryParameter::kStringParam ||
                 !absl::Base64Unescape(value.string_param(), &bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", name,
            "': must be bytes, or a string of them in base64"));
      }
    }
  }
  return upload;
}

}  // namespace

absl::Status LoadModel(
    ModelCatalogue& catalogue, bool may_control_models,
    const std::string& model_name,
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>*
        parameters) {
  const std::vector<std::string> names = ParameterNames(*parameters);
  RETURN_IF_ERROR(
      catalogue.CheckLoadAllowed(may_control_models, model_name, names));
  ASSIGN_OR_RETURN(std::optional<ModelUpload> upload, UploadOf(parameters));
  return catalogue.Load(may_control_models, model_name, names,
                        std::move(upload));
}

void EncodeIndex(const std::vector<ModelCatalogue::ModelState>& index,
                 inference::RepositoryIndexResponse* response) {
  for (const ModelCatalogue::ModelState& model : index) {
    auto* entry = response->add_models();
    entry->set_name(model.name);
    entry->set_version(kServedModelVersion);
    entry->set_state(model.state);
    entry->set_reason(model.reason);
  }
}

}  // namespace attnserve
