// The KServe v2 service's model catalogue: the built-in models and the
// model repository's, and the resolution of a model name (and version) to
// what serves it: its tensors, its kind (server/api/kserve_model_kinds.h)
// and, for a repository model, the weights it was loaded with.
//
// Thread-safe: the built-in models never change; the repository is read
// under its own lock (server/repository/model_repository.h). Nothing here
// blocks but for that lock.
#ifndef ATTNSERVE_SERVER_API_KSERVE_MODELS_H_
#define ATTNSERVE_SERVER_API_KSERVE_MODELS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/api/kserve_model_kinds.h"
#include "server/api/kserve_model_spec.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// The built-in models' tensors, in catalogue order.
const std::vector<KServeModelSpec>& BuiltInModelSpecs();
bool IsBuiltInModel(const std::string& name);

// The kind a repository model is served as, by its backend
// (additive_attention or nadaraya_watson); INTERNAL for any other, which
// the repository never loads.
absl::StatusOr<const ModelKind*> RepositoryModelKind(
    const RepositoryModel& model);
// The tensors a repository model is served with: its kind's, under `name`.
// A backend the repository does not load has none.
KServeModelSpec RepositoryModelSpec(const std::string& name,
                                    const RepositoryModel& model);

// A model as one call found it.
struct ResolvedModel {
  KServeModelSpec spec;  // under the name the call gave
  const ModelKind* kind = nullptr;  // never null once resolved; immortal
  // The repository model, held for as long as the call needs its weights
  // (an unload meanwhile does not free them); null for a built-in.
  std::shared_ptr<const RepositoryModel> repository_model;
};

// Resolves names against the built-in models, then the repository's.
class ModelCatalogue {
 public:
  // `repository` may be null (the built-in models only); it is borrowed
  // and must outlive the catalogue.
  explicit ModelCatalogue(ModelRepository* repository)
      : repository_(repository) {}

  // The model `name` at `version` (empty: the served one). NOT_FOUND naming
  // the served models, or the served version; INTERNAL for a repository
  // model of a backend the repository does not load.
  absl::StatusOr<ResolvedModel> Resolve(const std::string& name,
                                        const std::string& version) const;
  // Every model served now: the built-in ones, then the repository's.
  std::vector<std::string> Names() const;

 private:
  ModelRepository* const repository_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_KSERVE_MODELS_H_
