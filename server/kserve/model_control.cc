#include "server/kserve/model_control.h"

#include "server/models/model_kind.h"

namespace attnserve {

std::vector<std::string> ParameterNames(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>&
        parameters) {
  std::vector<std::string> names;
  for (const auto& [name, value] : parameters) names.push_back(name);
  return names;
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
