#include "server/models/model_catalogue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attn/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "server/models/model_kinds.h"
#include "server/repository/safetensors.h"

namespace attnserve {

absl::StatusOr<std::unique_ptr<ModelRepository>> LoadModelRepository(
    ModelRepository::Options options) {
  options.check_model = CheckStoredModel;
  options.grows_in_pieces = ReadsPieces;
  return ModelRepository::Load(options);
}

absl::StatusOr<std::unique_ptr<ModelRepository>> LoadModelRepository(
    const std::string& dir) {
  ModelRepository::Options options;
  options.dir = dir;
  return LoadModelRepository(std::move(options));
}

namespace {

// A stored model's signature: its kind's, under its own name, with the
// dimensions it fixes.
ModelSignature SignatureOf(const ModelKind& kind, const std::string& name,
                           const RepositoryModel& stored) {
  ModelSignature signature = kind.signature;
  signature.name = name;
  if (kind.stored_dimensions != nullptr) {
    kind.stored_dimensions(stored, &signature);
  }
  return signature;
}

}  // namespace

absl::StatusOr<ServedModel> ModelCatalogue::Resolve(
    const std::string& name, const std::string& version) const {
  ServedModel served;
  for (const ModelKind* kind : BuiltInModelKinds()) {
    if (kind->signature.name == name) {
      served.signature = kind->signature;
      served.kind = kind;
    }
  }
  if (served.kind == nullptr && repository_ != nullptr) {
    served.stored = repository_->Find(name);
    if (served.stored != nullptr) {
      served.kind = KindOfStored(*served.stored);
      if (served.kind == nullptr) {
        return absl::InternalError(absl::StrCat(
            "model '", name, "': backend '", served.stored->config.backend(),
            "' is not one the repository loads"));
      }
      served.signature = SignatureOf(*served.kind, name, *served.stored);
    }
  }
  if (served.kind == nullptr) {
    // A handful of names, not all: a repository may serve hundreds, and
    // each save_as adds one.
    constexpr size_t kNamesShown = 8;
    const std::vector<std::string> names = Names();
    std::string served_names = absl::StrJoin(
        names.begin(), names.begin() + std::min(names.size(), kNamesShown),
        ", ");
    if (names.size() > kNamesShown) {
      absl::StrAppend(&served_names, " and ", names.size() - kNamesShown,
                      " more (the repository index lists them all)");
    }
    return absl::NotFoundError(absl::StrCat(
        "model '", name, "' is not served; served: ", served_names));
  }
  if (!version.empty() && version != kServedModelVersion) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' version '",
                                            version, "' is not served; served: 1"));
  }
  return served;
}

absl::StatusOr<ServedModel> ModelCatalogue::ResolveStored(
    absl::string_view field, const std::string& name,
    const ModelKind& kind) const {
  ServedModel served;
  if (repository_ != nullptr) served.stored = repository_->Find(name);
  if (served.stored == nullptr ||
      served.stored->config.backend() != kind.backend) {
    return absl::NotFoundError(absl::StrCat(field, ": no ", kind.backend,
                                            " model '", name,
                                            "' in the model repository"));
  }
  served.kind = KindOfStored(*served.stored);
  served.signature = SignatureOf(*served.kind, name, *served.stored);
  return served;
}

std::vector<std::string> ModelCatalogue::Names() const {
  std::vector<std::string> names;
  for (const ModelKind* kind : BuiltInModelKinds()) {
    names.push_back(kind->signature.name);
  }
  if (repository_ != nullptr) {
    for (const std::string& name : repository_->Names()) {
      names.push_back(name);
    }
  }
  return names;
}

bool ModelCatalogue::IsBuiltIn(const std::string& name) {
  for (const ModelKind* kind : BuiltInModelKinds()) {
    if (kind->signature.name == name) return true;
  }
  return false;
}

absl::Status ModelCatalogue::SaveFittedModel(const std::string& name,
                                             float bandwidth,
                                             attn::TensorView x_train,
                                             attn::TensorView y_train) {
  if (repository_ == nullptr) {
    return absl::FailedPreconditionError(
        "save_as: the server runs without --model_repository");
  }
  const bool served = Stored(name);
  return Report(served ? "replace" : "save", name, "by save_as",
                repository_->SaveModel(
                    {"save_as", "fitted Nadaraya-Watson model"}, name,
                    TrainedNadarayaWatsonModel(name, bandwidth, x_train,
                                               y_train)));
}

absl::Status ModelCatalogue::SaveRefittedBandwidth(const std::string& name,
                                                   float bandwidth) {
  if (repository_ == nullptr) {
    return absl::FailedPreconditionError(
        "model_name: the server runs without --model_repository");
  }
  return Report(
      "replace", name, "by a refit",
      repository_->ReplaceModel(
          {"model_name", "fitted Nadaraya-Watson model"}, name,
          [&](const RepositoryModel& current)
              -> absl::StatusOr<RepositoryModel> {
            if (current.config.backend() != FittedNadarayaWatsonKind().backend) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "model_name: '", name, "' is no longer a nadaraya_watson "
                  "model; the fit itself finished"));
            }
            RepositoryModel refitted = current;
            attn::Tensor w = attn::Tensor::Zeros({1});
            w.data[0] = bandwidth;
            refitted.tensors["bandwidth"] = std::move(w);
            return refitted;
          }));
}

std::vector<ModelRepository::ModelState> ModelCatalogue::Index(
    bool server_ready, bool ready_only) const {
  std::vector<ModelRepository::ModelState> index;
  auto add = [&](const std::string& name, const std::string& state,
                 const std::string& reason) {
    if (ready_only && state != "READY") return;
    index.push_back({name, state, reason});
  };
  for (const ModelKind* kind : BuiltInModelKinds()) {
    add(kind->signature.name, server_ready ? "READY" : "UNAVAILABLE",
        server_ready ? "" : "the server is draining");
  }
  if (repository_ != nullptr) {
    for (const ModelRepository::ModelState& model :
         repository_->Index()) {
      const bool serving = model.state == "READY";
      add(model.name, serving && !server_ready ? "UNAVAILABLE" : model.state,
          serving && !server_ready ? "the server is draining" : model.reason);
    }
  }
  return index;
}

absl::Status ModelCatalogue::CheckSaveAllowed(bool may_save,
                                              const std::string& name) const {
  absl::Status refused;
  if (repository_ == nullptr) {
    refused = absl::FailedPreconditionError(
        "save_as: the server runs without --model_repository");
  } else if (control_.needs_permission && !may_save) {
    refused = absl::PermissionDeniedError(
        "save_as: this token may not write models; give it the "
        "permission save_as in --auth_tokens_file");
  }
  if (refused.ok()) return refused;
  return Report(Stored(name) ? "replace" : "save", name, "by save_as",
                std::move(refused));
}

absl::Status ModelCatalogue::CheckControlAllowed(
    bool may_control_models, const std::string& model_name,
    const std::vector<std::string>& parameters, bool uploads) const {
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
  // Parameters Triton's clients send that mean nothing here are accepted;
  // a load's upload (config, file:*) is SaveUpload's to check; others are
  // refused rather than ignored.
  for (const std::string& name : parameters) {
    if (name == "unload_dependents") continue;  // no model depends on another
    if (uploads && (name == "config" || absl::StartsWith(name, "file:"))) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name, "': not supported",
        uploads ? "; a load takes 'config' (the model's config as JSON) and "
                  "'file:weights.safetensors'"
                : ""));
  }
  return absl::OkStatus();
}

absl::Status ModelCatalogue::SaveUpload(const std::string& model_name,
                                        ModelUpload upload) {
  static constexpr char kWeightsFile[] = "file:weights.safetensors";
  if (IsBuiltIn(model_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_name: '", model_name,
        "' is built in; upload a model under another name"));
  }
  for (const auto& [name, bytes] : upload.files) {
    if (name != kWeightsFile) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "': a model has one file, ", kWeightsFile,
          " (no folders, no other names); nothing was written"));
    }
  }
  auto weights = upload.files.find(kWeightsFile);
  if (upload.config_json.empty() || weights == upload.files.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        upload.config_json.empty() ? kWeightsFile : "config",
        ": an upload is both 'config' (the model's config as JSON) and '",
        kWeightsFile, "'; nothing was written"));
  }
  const int64_t limit = repository_->max_model_bytes();
  if (static_cast<int64_t>(weights->second.size()) > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        kWeightsFile, ": ", weights->second.size(), " bytes for model '",
        model_name, "', over the limit of ", limit,
        " (--max_model_bytes); nothing was written"));
  }
  RepositoryModel model;
  const google::protobuf::util::Status parsed =
      google::protobuf::util::JsonStringToMessage(upload.config_json,
                                                  &model.config);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: not an inference.ModelConfig in JSON (",
        std::string(parsed.message()), "); nothing was written"));
  }
  if (model.config.name().empty()) model.config.set_name(model_name);
  if (model.config.name() != model_name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: name '", model.config.name(), "' differs from model_name '",
        model_name, "'; nothing was written"));
  }
  // The tensors view the uploaded bytes, which are written as they are:
  // nothing of the upload is copied (its bytes were moved out of the request).
  model.weights_file =
      FileBytesInMemory(std::move(weights->second), "uploaded in a request");
  absl::StatusOr<std::map<std::string, StoredTensor>> tensors =
      ParseSafetensorsShared(model.weights_file);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_name, ": ", kWeightsFile, ": ", tensors.status().message(),
        "; nothing was written"));
  }
  model.tensors = *std::move(tensors);
  const std::string backend = model.config.backend();
  return repository_->SaveModel(
      {"load", absl::StrCat("uploaded ", backend, " model")}, model_name,
      std::move(model));
}

absl::Status ModelCatalogue::CheckAppendAllowed(
    bool may_append, const std::string& name) const {
  return CheckRowsChangeAllowed("append", may_append, name);
}

absl::Status ModelCatalogue::CheckRowsChangeAllowed(
    const std::string& event, bool may_append, const std::string& name) const {
  absl::Status refused;
  if (repository_ == nullptr) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        event, ": the server runs without --model_repository"));
  } else if (control_.needs_permission && !may_append) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        event, ": this token may not append to or evict from models; give "
        "it the permission append (or model_control) in --auth_tokens_file"));
  } else if (IsBuiltIn(name)) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        "name: '", name, "' is a built-in model, which holds no rows"));
  }
  if (refused.ok()) return refused;
  return Report(event, name, "rows", std::move(refused));
}

absl::StatusOr<ModelRepository::Appended> ModelCatalogue::Append(
    bool may_append, const std::string& name, const attn::TensorView& keys,
    const attn::TensorView& values,
    const std::optional<MemorySettings>& create) {
  RETURN_IF_ERROR(CheckAppendAllowed(may_append, name));
  ModelRepository::AppendRequest request;
  request.name = name;
  request.prepare = [&](const RepositoryModel& model)
      -> absl::StatusOr<ModelRepository::Rows> {
    if (create.has_value()) {
      RETURN_IF_ERROR(CheckMemorySettings("create", name, model, *create));
    }
    const ModelKind* kind = KindOfStored(model);
    if (kind == nullptr || kind->prepare_append == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name: model '", name, "' (backend ", model.config.backend(),
          ") holds no rows to append to; attention_memory models and "
          "nadaraya_watson models holding a training set do"));
    }
    return kind->prepare_append(name, model, keys, values);
  };
  bool created = false;
  if (create.has_value()) {
    request.create = [&]() -> absl::StatusOr<RepositoryModel> {
      created = true;
      return NewAttentionMemory(name, *create, keys, values);
    };
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<ModelRepository::Appended> appended =
      repository_->AppendRows(request);
  if (appended.ok() && created) {
    appended->evicted = keys.shape[0] - appended->rows;  // its window's
  }
  absl::Status reported =
      Report(created ? "save" : "append", name,
             created ? "by append" : "rows", appended.status(),
             absl::Now() - start);
  if (!reported.ok()) return reported;
  return appended;
}

absl::StatusOr<ModelRepository::Evicted> ModelCatalogue::Evict(
    bool may_append, const std::string& name, int64_t oldest) {
  absl::Status allowed = CheckRowsChangeAllowed("evict", may_append, name);
  if (!allowed.ok()) return allowed;
  ModelRepository::EvictRequest request;
  request.name = name;
  request.oldest = oldest;
  request.row_tensors = [&](const RepositoryModel& model)
      -> absl::StatusOr<std::vector<std::string>> {
    const ModelKind* kind = KindOfStored(model);
    if (kind == nullptr || kind->row_tensors.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name: model '", name, "' (backend ", model.config.backend(),
          ") holds no rows to evict; attention_memory models and "
          "nadaraya_watson models holding a training set do"));
    }
    return kind->row_tensors;
  };
  const absl::Time start = absl::Now();
  absl::StatusOr<ModelRepository::Evicted> evicted =
      repository_->EvictRows(request);
  absl::Status reported = Report("evict", name, "rows", evicted.status(),
                                 absl::Now() - start);
  if (!reported.ok()) return reported;
  return evicted;
}

std::string ModelEvent::Describe() const {
  return absl::StrCat("model '", model, "': ", event, " ", how, ": ",
                      status.ok() ? "done"
                                  : absl::StrCat("refused: ", status.ToString()));
}

bool ModelCatalogue::Stored(const std::string& model_name) const {
  return repository_ != nullptr && repository_->Find(model_name) != nullptr;
}

absl::Status ModelCatalogue::Report(std::string event,
                                    const std::string& model_name,
                                    std::string how, absl::Status status,
                                    absl::Duration took) const {
  if (control_.on_event) {
    control_.on_event(ModelEvent{std::move(event), model_name, std::move(how),
                                 status, took});
  }
  return status;
}

std::vector<ModelCatalogue::RowCount> ModelCatalogue::RowCounts() const {
  std::vector<RowCount> counts;
  if (repository_ == nullptr) return counts;
  for (const std::string& name : repository_->Names()) {
    std::shared_ptr<const RepositoryModel> model = repository_->Find(name);
    if (model == nullptr) continue;  // unloaded meanwhile
    const ModelKind* kind = KindOfStored(*model);
    if (kind == nullptr || kind->row_tensors.empty()) continue;
    const StoredTensor& rows = model->tensors.at(kind->row_tensors.front());
    counts.push_back({name, rows.shape[0], 1 + model->appended_files,
                      model->evicted_rows,
                      static_cast<int64_t>(rows.parts().size())});
  }
  return counts;
}

absl::Status ModelCatalogue::Load(bool may_control_models,
                                   const std::string& model_name,
                                   const std::vector<std::string>& parameters,
                                   std::optional<ModelUpload> upload) {
  const bool served = Stored(model_name);
  const char* how = upload.has_value() ? "uploaded" : "from the repository";
  absl::Status status = LoadUnreported(may_control_models, model_name,
                                       parameters, std::move(upload));
  // A built-in model is always served: loading one changes nothing.
  if (status.ok() && IsBuiltIn(model_name)) return status;
  return Report(served ? "replace" : "load", model_name, how,
                std::move(status));
}

absl::Status ModelCatalogue::LoadUnreported(
    bool may_control_models, const std::string& model_name,
    const std::vector<std::string>& parameters,
    std::optional<ModelUpload> upload) {
  RETURN_IF_ERROR(CheckControlAllowed(may_control_models, model_name,
                                      parameters, upload.has_value()));
  if (upload.has_value()) return SaveUpload(model_name, *std::move(upload));
  if (IsBuiltIn(model_name)) return absl::OkStatus();
  return repository_->LoadModel(model_name);
}

absl::Status ModelCatalogue::Unload(
    bool may_control_models, const std::string& model_name,
    const std::vector<std::string>& parameters) {
  absl::Status status = CheckControlAllowed(may_control_models, model_name,
                                            parameters, /*uploads=*/false);
  if (status.ok() && IsBuiltIn(model_name)) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "model_name: '", model_name, "' is built in and always served"));
  }
  if (status.ok()) status = repository_->UnloadModel(model_name);
  return Report("unload", model_name, "from the repository",
                std::move(status));
}

}  // namespace attnserve
