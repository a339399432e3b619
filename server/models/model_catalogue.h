// The catalogue of served models, one per process, lent to every front end:
// the built-in models and the repository's stored ones; the resolution of a
// model name (and version) to what serves it: its signature under that
// name, its kind (server/models/model_kind.h) and, for a stored model, what
// it holds; the models' index; and live model control (Triton's
// model_repository extension): loading, reloading and unloading stored
// models, and storing fitted ones. Front ends only decode their requests
// into these calls and encode the answers.
//
// Thread-safe: the built-in models never change; the repository is read
// under its own lock and serializes loads, unloads and saves
// (server/repository/model_repository.h). Load, Unload and
// SaveFittedModel block on file I/O; everything else only for the
// repository's lock.
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_CATALOGUE_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_CATALOGUE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/models/model_kind.h"
#include "server/models/model_kinds.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// A model as one call found it.
struct ServedModel {
  ModelSignature signature;  // under the name the call gave
  const ModelKind* kind = nullptr;  // never null once resolved; immortal
  // The stored model, held for as long as the call needs what it holds (an
  // unload meanwhile does not free it); null for a built-in.
  std::shared_ptr<const RepositoryModel> stored;
};

// The model repository as the server runs it: `options` with every stored
// model checked against its kind (CheckStoredModel,
// server/models/model_kinds.h) when it is loaded or saved.
// ModelRepository::Load's statuses.
absl::StatusOr<std::unique_ptr<ModelRepository>> LoadModelRepository(
    ModelRepository::Options options);
absl::StatusOr<std::unique_ptr<ModelRepository>> LoadModelRepository(
    const std::string& dir);

// Triton's --model-control-mode: with `explicit_mode`, loads and unloads
// change what is served (calls in flight on an unloaded model finish with
// it); without it they answer FAILED_PRECONDITION. Built-in models are
// always served: loading one is a no-op, unloading one INVALID_ARGUMENT.
// With `needs_permission` (token authentication on), every change to the
// repository needs its permission (server/transport/auth.h): loads and
// unloads model_control, a fit's save_as save_as; others get
// PERMISSION_DENIED. The catalogue is the one place that decides it.
//
// Every change to the served models, and every refused attempt at one, is
// reported to `on_event` (when set) as it happens, for the log and the
// metrics: Triton logs each load and unload with the reason for a failure.
struct ModelEvent {
  // "load" (a new model, from the repository or uploaded), "replace" (a
  // load, upload or save over a served model), "unload", "save" (a new
  // model by FitBandwidth's save_as, or a memory made by an append),
  // "append" (rows added to a stored model), "evict" (its oldest rows
  // dropped).
  std::string event;
  std::string model;
  // "from the repository", "uploaded", "by save_as", "by append", "rows"
  std::string how;
  absl::Status status;  // OK, or why it was refused (nothing changed)
  // How long an append or eviction took; zero for other events.
  absl::Duration took;
  // One log line, e.g. "model 'm': replace uploaded: OK".
  std::string Describe() const;
};
struct ModelControl {
  bool explicit_mode = false;
  bool needs_permission = false;
  // May be empty. Called on the thread that made the change, after it (so
  // from several threads at once when front ends load concurrently: it must
  // be thread-safe), and must not call back into the catalogue.
  std::function<void(const ModelEvent&)> on_event;
};

// A model sent with its load request (Triton's model_repository extension):
// its config as JSON (an inference.ModelConfig: the `config` parameter) and
// its files by parameter name; a model has one, "file:weights.safetensors".
// Front ends decode their wire's parameters into it.
struct ModelUpload {
  std::string config_json;
  std::map<std::string, std::string> files;
};

class ModelCatalogue {
 public:
  // `repository` may be null (the built-in models only); it is borrowed
  // and must outlive the catalogue.
  explicit ModelCatalogue(ModelRepository* repository,
                          const ModelControl& control = {})
      : repository_(repository), control_(control) {}

  // The model `name` at `version` (empty: the served one). NOT_FOUND naming
  // the served models, or the served version; INTERNAL for a stored model
  // of a backend no kind has (the repository never loads one).
  absl::StatusOr<ServedModel> Resolve(const std::string& name,
                                      const std::string& version) const;
  // The stored model `name` of `kind`'s backend, for a call that names one
  // in a request field (the typed API's weights_name), served as the kind
  // its contents make it (KindOfStored): NOT_FOUND naming `field` and the
  // backend when there is none.
  absl::StatusOr<ServedModel> ResolveStored(absl::string_view field,
                                            const std::string& name,
                                            const ModelKind& kind) const;
  // Every model served now: the built-in ones, then the repository's.
  std::vector<std::string> Names() const;
  static bool IsBuiltIn(const std::string& name);

  // Every model with its state: the built-in ones READY (UNAVAILABLE, "the
  // server is draining", while not `server_ready`), then the repository's
  // as it reports them (a READY one UNAVAILABLE while draining); only the
  // READY ones when `ready_only`.
  using ModelState = ModelRepository::ModelState;
  std::vector<ModelState> Index(bool server_ready, bool ready_only) const;

  // Live model control. `may_control_models`: the call's token grants
  // model_control (or tokens are off); `parameters`: the names of the
  // request's parameters. OK, or why not: FAILED_PRECONDITION (model
  // control off, no repository), PERMISSION_DENIED (the call's token),
  // INVALID_ARGUMENT (no name, an unsupported parameter, unloading a
  // built-in model), or the repository's own error (NOT_FOUND, a broken
  // model's INVALID_ARGUMENT).
  //
  // A load with an `upload` (the parameters `config` and
  // `file:weights.safetensors`) writes the model into the repository with
  // the crash-safe save (ModelRepository::SaveModel) and serves it: an
  // upload refused or interrupted leaves the served model and the disk as
  // they were. INVALID_ARGUMENT naming the parameter: a file without a
  // config or a config without the file, any other file name (folders,
  // "..", absolute paths: nothing is written outside the model's folder), a
  // config that is not a ModelConfig in JSON or names another model, bytes
  // that are not safetensors, a model its kind refuses, a built-in model's
  // name; RESOURCE_EXHAUSTED for a file over --max_model_bytes; the save's
  // own errors.
  absl::Status Load(bool may_control_models, const std::string& model_name,
                    const std::vector<std::string>& parameters,
                    std::optional<ModelUpload> upload = std::nullopt);
  // Load's checks of who may load what, before a front end decodes an
  // upload: a caller without permission hears that first.
  absl::Status CheckLoadAllowed(bool may_control_models,
                                const std::string& model_name,
                                const std::vector<std::string>& parameters) const {
    return CheckControlAllowed(may_control_models, model_name, parameters,
                               /*uploads=*/true);
  }
  absl::Status Unload(bool may_control_models, const std::string& model_name,
                      const std::vector<std::string>& parameters);
  // Whether a caller may save a fit (FitBandwidth's save_as), checked before
  // the fit runs: FAILED_PRECONDITION without a repository,
  // PERMISSION_DENIED for a caller without the save_as permission while
  // permissions are needed.
  // A refusal is reported (ModelControl::on_event) under `name`.
  absl::Status CheckSaveAllowed(bool may_save, const std::string& name) const;

  // Stores a fitted Nadaraya-Watson model `name` holding `bandwidth` and
  // the training set it was fitted on (copied), and serves it at once, to
  // answer x_query alone: the repository's crash-safe save and its
  // statuses (ModelRepository::SaveModel), FAILED_PRECONDITION without a
  // repository. Blocks on file I/O and on other saves.
  absl::Status SaveFittedModel(const std::string& name, float bandwidth,
                               attn::TensorView x_train,
                               attn::TensorView y_train);

  // Appends rows to the stored model `name` (ModelRepository::AppendRows:
  // durable before the answer, seen by every call that starts after it):
  // an attention memory's `keys` [n, d] and `values` [n, v], or a trained
  // Nadaraya-Watson model's x_train and y_train rows as `keys` and
  // `values`, each as the model holds them (its kind's prepare_append).
  // With `create`, a memory not yet served is made of these rows with
  // those settings; one served must have them. `may_append`: the call's
  // token grants append or model_control (or tokens are off). OK, or why
  // not, nothing changed:
  // - FAILED_PRECONDITION without a repository;
  // - PERMISSION_DENIED for a caller without the permission while
  //   permissions are needed;
  // - INVALID_ARGUMENT: a built-in model, a model whose kind holds no rows
  //   (additive weights, a bandwidth alone), rows its kind refuses, settings
  //   that differ from the memory's;
  // - NOT_FOUND: no such model and no `create`;
  // - the repository's other statuses (RESOURCE_EXHAUSTED over
  //   --max_model_bytes or on a full disk).
  // Each is reported (ModelControl::on_event) as an "append" event, or a
  // "save" when it made the memory. Blocks on file I/O and on other
  // writers.
  // Drops the `oldest` rows of the stored model `name`
  // (ModelRepository::EvictRows: durable before the answer): row i is then
  // row i - oldest. Who may is Append's permission, and the statuses are
  // Append's, with INVALID_ARGUMENT for `oldest` < 1 or one that would
  // leave no row. Reported as an "evict" event.
  absl::StatusOr<ModelRepository::Evicted> Evict(bool may_append,
                                                 const std::string& name,
                                                 int64_t oldest);
  // Append's (and Evict's) checks of who may change rows, before a front
  // end decodes them: a caller without permission hears that first.
  absl::Status CheckAppendAllowed(bool may_append,
                                  const std::string& name) const;
  absl::StatusOr<ModelRepository::Appended> Append(
      bool may_append, const std::string& name, const attn::TensorView& keys,
      const attn::TensorView& values,
      const std::optional<MemorySettings>& create);

  // Sets the fitted bandwidth of the stored Nadaraya-Watson model `name`
  // (a refit on its own training set: FitBandwidth's model_name), written
  // whole with the rows it holds now (ModelRepository::ReplaceModel), and
  // serves it. Reported as a "replace" by a refit.
  absl::Status SaveRefittedBandwidth(const std::string& name, float bandwidth);

  // Every served model whose kind holds rows (memories, training sets):
  // its rows, files and rows evicted since its last whole save or
  // compaction, for the metrics.
  struct RowCount {
    std::string model;
    int64_t rows = 0;
    int64_t files = 0;
    int64_t evicted_rows = 0;
    int64_t pieces = 0;  // what its rows are served from (StoredTensor::parts)
  };
  std::vector<RowCount> RowCounts() const;

  // Null without --model_repository.
  ModelRepository* repository() const { return repository_; }
  bool explicit_model_control() const { return control_.explicit_mode; }

 private:
  // Why a load or unload of `model_name` may not happen, if it may not.
  // `uploads`: a load, whose parameters may carry a model.
  absl::Status CheckControlAllowed(bool may_control_models,
                                   const std::string& model_name,
                                   const std::vector<std::string>& parameters,
                                   bool uploads) const;
  // Append's and Evict's checks, refusals reported as `event`.
  absl::Status CheckRowsChangeAllowed(const std::string& event,
                                      bool may_append,
                                      const std::string& name) const;
  // Writes and serves an uploaded model (Load).
  absl::Status SaveUpload(const std::string& model_name, ModelUpload upload);
  // Load and SaveFittedModel without their report.
  absl::Status LoadUnreported(bool may_control_models,
                              const std::string& model_name,
                              const std::vector<std::string>& parameters,
                              std::optional<ModelUpload> upload);
  // Whether `model_name` is served from the repository now.
  bool Stored(const std::string& model_name) const;
  // Tells control_.on_event; returns `status`.
  absl::Status Report(std::string event, const std::string& model_name,
                      std::string how, absl::Status status,
                      absl::Duration took = absl::ZeroDuration()) const;

  ModelRepository* const repository_;
  const ModelControl control_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_CATALOGUE_H_
