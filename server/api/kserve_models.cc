#include "server/api/kserve_models.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attn/status_macros.h"

namespace attnserve {

const std::vector<KServeModelSpec>& BuiltInModelSpecs() {
  static const auto* const specs = [] {
    auto* specs = new std::vector<KServeModelSpec>;
    for (const ModelKind* kind : BuiltInModelKinds()) {
      specs->push_back(kind->spec);
    }
    return specs;
  }();
  return *specs;
}

bool IsBuiltInModel(const std::string& name) {
  for (const ModelKind* kind : BuiltInModelKinds()) {
    if (kind->spec.name == name) return true;
  }
  return false;
}

absl::StatusOr<const ModelKind*> RepositoryModelKind(
    const RepositoryModel& model) {
  const std::string& backend = model.config.backend();
  if (backend == "additive_attention") return &AdditiveAttentionKind();
  if (backend == "nadaraya_watson") return &FittedNadarayaWatsonKind();
  return absl::InternalError(absl::StrCat(
      "model '", model.config.name(), "': backend '", backend,
      "' is not one the repository loads"));
}

KServeModelSpec RepositoryModelSpec(const std::string& name,
                                    const RepositoryModel& model) {
  absl::StatusOr<const ModelKind*> kind = RepositoryModelKind(model);
  KServeModelSpec spec;
  if (kind.ok()) {
    spec = (*kind)->spec;
  } else {
    // Never resolved (Resolve answers INTERNAL), so never counted; the
    // field only needs a value.
    spec.rpc = Rpc::kNadarayaWatson;
  }
  spec.name = name;
  return spec;
}

absl::StatusOr<ResolvedModel> ModelCatalogue::Resolve(
    const std::string& name, const std::string& version) const {
  ResolvedModel resolved;
  for (const ModelKind* kind : BuiltInModelKinds()) {
    if (kind->spec.name == name) {
      resolved.spec = kind->spec;
      resolved.kind = kind;
    }
  }
  if (resolved.kind == nullptr && repository_ != nullptr) {
    resolved.repository_model = repository_->Find(name);
    if (resolved.repository_model != nullptr) {
      const RepositoryModel& model = *resolved.repository_model;
      ASSIGN_OR_RETURN(resolved.kind, RepositoryModelKind(model));
      resolved.spec = resolved.kind->spec;
      resolved.spec.name = name;
    }
  }
  if (resolved.kind == nullptr) {
    return absl::NotFoundError(absl::StrCat("model '", name,
                                            "' is not served; served: ",
                                            absl::StrJoin(Names(), ", ")));
  }
  if (!version.empty() && version != kServedModelVersion) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' version '",
                                            version, "' is not served; served: 1"));
  }
  return resolved;
}

std::vector<std::string> ModelCatalogue::Names() const {
  std::vector<std::string> names;
  for (const ModelKind* kind : BuiltInModelKinds()) {
    names.push_back(kind->spec.name);
  }
  if (repository_ != nullptr) {
    for (const std::string& name : repository_->Names()) {
      names.push_back(name);
    }
  }
  return names;
}

}  // namespace attnserve
