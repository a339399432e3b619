#include "server/repository/model_repository.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attn/status_macros.h"
#include "google/protobuf/text_format.h"
#include "server/repository/safetensors.h"

namespace attnserve {
namespace {

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

// Reads and checks the model in folder `dir`/`name`, its weights mapped
// when `map_weights` and the file allows. Messages name the files as
// `name`/<file>, relative to the repository; `log` gets why a file that
// could have been mapped was copied.
absl::StatusOr<std::shared_ptr<const RepositoryModel>> ReadModel(
    FileSystem& fs, const std::string& dir, const std::string& name,
    const ModelRepository::CheckModel& check, int64_t max_model_bytes,
    bool map_weights, const std::function<void(const std::string&)>& log) {
  auto model = std::make_shared<RepositoryModel>();
  auto failed = [&](const std::string& file, const absl::Status& status) {
    if (absl::IsResourceExhausted(status)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name, "/", file, ": ", status.message(),
                       " (--max_model_bytes)"));
    }
    return absl::Status(status.code(),
                        absl::StrCat(name, "/", file, ": cannot open (",
                                     status.message(), ")"));
  };
  const std::string folder = dir + "/" + name + "/";
  absl::StatusOr<std::string> config_text =
      fs.ReadFile(folder + "config.pbtxt", max_model_bytes);
  if (!config_text.ok()) return failed("config.pbtxt", config_text.status());
  if (!google::protobuf::TextFormat::ParseFromString(*config_text,
                                                     &model->config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "/config.pbtxt: not an inference.ModelConfig in protobuf "
              "text format"));
  }
  if (model->config.name() != name) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "/config.pbtxt: name '", model->config.name(),
        "' differs from its folder's name"));
  }
  const std::string weights_path = folder + "weights.safetensors";
  absl::StatusOr<std::shared_ptr<const FileBytes>> weights;
  if (map_weights) {
    weights = fs.MapFile(weights_path, max_model_bytes);
    if (weights.ok() && !(*weights)->why_copied().empty() &&
        !(*weights)->bytes().empty()) {
      log(absl::StrCat("'", name, "': weights.safetensors read into memory, ",
                       (*weights)->why_copied()));
    }
  } else {
    absl::StatusOr<std::string> bytes =
        fs.ReadFile(weights_path, max_model_bytes);
    if (bytes.ok()) {
      weights = FileBytesInMemory(*std::move(bytes), "--map_model_weights is off");
    } else {
      weights = bytes.status();
    }
  }
  if (!weights.ok()) return failed("weights.safetensors", weights.status());
  model->weights_mapped = (*weights)->why_copied().empty();
  absl::StatusOr<std::map<std::string, StoredTensor>> tensors =
      ParseSafetensorsShared(*std::move(weights));
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "/weights.safetensors: ", tensors.status().message()));
  }
  model->tensors = *std::move(tensors);
  if (check) RETURN_IF_ERROR(check(name, *model));
  model->held_memory = std::make_shared<const attn::HeldMemory>(name);
  return std::shared_ptr<const RepositoryModel>(std::move(model));
}

// A leftover of an interrupted save: ".<name>.tmp-<id>" (a new version being
// written, or the old one after the exchange) or ".<name>.old-<id>" (the old
// version moved aside where there is no exchange). Sets `model` to <name>.
bool IsLeftover(const std::string& entry, std::string* model, bool* old) {
  if (entry.size() < 2 || entry[0] != '.') return false;
  for (const char* kind : {".tmp-", ".old-"}) {
    const size_t at = entry.find(kind);
    if (at == std::string::npos) continue;
    const std::string name = entry.substr(1, at - 1);
    const std::string id = entry.substr(at + 5);
    if (!ValidName(name) || id.empty() ||
        id.find_first_not_of("0123456789-") != std::string::npos) {
      continue;
    }
    *model = name;
    *old = kind[1] == 'o';
    return true;
  }
  return false;
}

// Writes `bytes` as the new file `path`: every write, the fsync and the
// close checked; the file is closed whatever failed.
absl::Status WriteDurably(FileSystem& fs, const std::string& path,
                          absl::string_view bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.NewWritableFile(path));
  absl::Status status = file->Append(bytes);
  if (status.ok()) status = file->Sync();
  absl::Status closed = file->Close();
  return status.ok() ? closed : status;
}

// The answer for a save of `name` that failed at `step` with the file
// system's `status`: its code kept where it tells the client what to do
// (RESOURCE_EXHAUSTED, FAILED_PRECONDITION), INTERNAL otherwise.
absl::Status SaveError(absl::string_view field, const std::string& name,
                       absl::string_view step, const absl::Status& status) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string why;
  if (absl::IsResourceExhausted(status)) {
    code = absl::StatusCode::kResourceExhausted;
    why = " (the model repository's file system is full)";
  } else if (absl::IsFailedPrecondition(status)) {
    code = absl::StatusCode::kFailedPrecondition;
    why = " (the model repository is read-only or not writable by the server)";
  } else if (absl::IsNotFound(status)) {
    code = absl::StatusCode::kFailedPrecondition;
    why = " (the model repository folder is gone)";
  }
  return absl::Status(code, absl::StrCat(field, " '", name, "': ", step, ": ",
                                         status.message(), why,
                                         "; the model is unchanged"));
}

}  // namespace

void ModelRepository::Log(const std::string& note) const {
  if (log_) {
    log_(note);
  } else {
    absl::FPrintF(stderr, "attnserve: model repository: %s\n", note);
  }
}

std::vector<std::string> ModelRepository::Folders() const {
  std::vector<std::string> names;
  absl::StatusOr<std::vector<FileSystem::Entry>> entries = fs_->ListDir(dir_);
  if (!entries.ok()) return names;
  for (const FileSystem::Entry& entry : *entries) {
    if (entry.name[0] != '.' && entry.is_dir) names.push_back(entry.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void ModelRepository::CleanUpLeftovers(absl::Duration older_than) const {
  absl::StatusOr<std::vector<FileSystem::Entry>> entries = fs_->ListDir(dir_);
  if (!entries.ok()) return;
  // Newest first, so that a model folder missing after a crash gets its
  // latest version back.
  std::sort(entries->begin(), entries->end(),
            [](const FileSystem::Entry& a, const FileSystem::Entry& b) {
              return a.modified > b.modified;
            });
  std::set<std::string> present;
  for (const FileSystem::Entry& entry : *entries) {
    if (entry.name[0] != '.') present.insert(entry.name);
  }
  const absl::Time now = absl::Now();
  for (const FileSystem::Entry& entry : *entries) {
    std::string model;
    bool old = false;
    if (!IsLeftover(entry.name, &model, &old)) continue;
    const std::string path = dir_ + "/" + entry.name;
    if (old && present.count(model) == 0) {
      // Moved aside by a save (no RENAME_EXCHANGE) that died before the new
      // version took its place: the old version comes back.
      absl::Status status = fs_->Rename(path, dir_ + "/" + model);
      if (status.ok()) status = fs_->SyncDir(dir_);
      if (status.ok()) {
        present.insert(model);
        Log(absl::StrCat("put back '", model, "' from ", entry.name,
                         ", left by an interrupted save"));
      } else {
        Log(absl::StrCat("cannot put back '", model, "' from ", entry.name,
                         ": ", status.message()));
      }
      continue;
    }
    if (now - entry.modified < older_than) {
      Log(absl::StrCat("ignored ", entry.name,
                       ": a save in progress, or left by one that was "
                       "interrupted; removed once it is ",
                       absl::FormatDuration(older_than), " old"));
      continue;
    }
    const absl::Status removed = RemoveTree(*fs_, path);
    if (removed.ok()) {
      Log(absl::StrCat("removed ", entry.name, ", left by an interrupted save"));
    } else {
      Log(absl::StrCat("cannot remove ", entry.name,
                       " (left by an interrupted save; ignored): ",
                       removed.message()));
    }
  }
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(
    const std::string& dir) {
  Options options;
  options.dir = dir;
  return Load(options);
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(
    const Options& options) {
  FileSystem* fs = options.file_system != nullptr ? options.file_system
                                                  : DefaultFileSystem();
  std::unique_ptr<ModelRepository> repository(new ModelRepository(options, fs));
  if (options.dir.empty()) return repository;
  absl::StatusOr<std::vector<FileSystem::Entry>> listed =
      fs->ListDir(options.dir);
  if (!listed.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "--model_repository ", options.dir, ": cannot open the folder (",
        listed.status().message(), ")"));
  }
  repository->CleanUpLeftovers(options.remove_leftovers_after);
  for (const std::string& name : repository->Folders()) {
    absl::StatusOr<std::shared_ptr<const RepositoryModel>> model =
        ReadModel(*fs, options.dir, name, options.check_model,
                  options.max_model_bytes, options.map_weights,
                  [&](const std::string& note) { repository->Log(note); });
    absl::MutexLock lock(&repository->mu_);
    if (model.ok()) {
      repository->models_[name] = *std::move(model);
    } else if (options.fail_on_model_error) {
      return absl::Status(model.status().code(),
                          absl::StrCat("--model_repository ", options.dir, ": ",
                                       model.status().message()));
    } else {
      repository->Log(absl::StrCat("not serving '", name,
                                   "': ", model.status().message()));
      repository->unloaded_[name].reason =
          absl::StrCat("failed to load: ", model.status().message());
    }
  }
  return repository;
}

absl::Status ModelRepository::LoadModel(const std::string& name) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        "the server runs without --model_repository");
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_name: '", name, "' must be 1-128 letters, digits, '_' or '-'"));
  }
  absl::MutexLock write(&write_mu_);
  absl::StatusOr<FileSystem::Entry> folder = fs_->Stat(dir_ + "/" + name);
  if (!folder.ok() || !folder->is_dir) {
    return absl::NotFoundError(absl::StrCat(
        "model_name: no folder '", name, "' in the model repository"));
  }
  absl::StatusOr<std::shared_ptr<const RepositoryModel>> model =
      ReadModel(*fs_, dir_, name, check_model_, max_model_bytes_,
                map_weights_, [this](const std::string& note) { Log(note); });
  absl::MutexLock lock(&mu_);
  if (!model.ok()) {
    // What serves stays (a half-copied folder never takes a model away),
    // and the index says why it is not the folder's version.
    if (models_.count(name) != 0) {
      reload_failures_[name] = absl::StrCat(
          "failed to reload, the version loaded before still serves: ",
          model.status().message());
    } else {
      unloaded_[name].reason =
          absl::StrCat("failed to load: ", model.status().message());
    }
    return absl::Status(model.status().code(),
                        absl::StrCat("failed to load '", name,
                                     "': ", model.status().message()));
  }
  models_[name] = *std::move(model);
  unloaded_.erase(name);
  reload_failures_.erase(name);
  return absl::OkStatus();
}

absl::Status ModelRepository::UnloadModel(const std::string& name) {
  absl::MutexLock write(&write_mu_);
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model_name: '", name, "' is not loaded"));
  }
  unloaded_[name] = Unloaded{it->second, "unloaded"};
  models_.erase(it);
  reload_failures_.erase(name);
  return absl::OkStatus();
}

std::vector<ModelRepository::ModelState> ModelRepository::Index() const {
  std::vector<std::string> names = Folders();
  absl::MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) names.push_back(name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<ModelState> states;
  for (const std::string& name : names) {
    ModelState state{name, "READY", ""};
    if (models_.count(name) != 0) {
      auto failure = reload_failures_.find(name);
      if (failure != reload_failures_.end()) state.reason = failure->second;
    } else {
      auto it = unloaded_.find(name);
      if (it == unloaded_.end()) {
        state.state = "UNAVAILABLE";
        state.reason = "not loaded";
      } else if (!it->second.model.expired()) {
        state.state = "UNLOADING";
        state.reason = "unloaded; calls that hold it are finishing";
      } else {
        state.state = "UNAVAILABLE";
        state.reason = it->second.reason;
      }
    }
    states.push_back(std::move(state));
  }
  return states;
}

std::shared_ptr<const RepositoryModel> ModelRepository::Find(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second;
}

std::vector<std::string> ModelRepository::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, model] : models_) names.push_back(name);
  return names;
}

absl::Status ModelRepository::WriteModelFolder(absl::string_view field,
                                               const std::string& name,
                                               const RepositoryModel& model) {
  const std::string folder = dir_ + "/" + name;
  // What could not be read back is not written. Bytes the tensors were
  // parsed from are that already, and are written as they are.
  std::string serialized;
  if (model.weights_file == nullptr) {
    serialized = SerializeSafetensors(model.tensors);
  }
  const absl::string_view weights = model.weights_file != nullptr
                                        ? model.weights_file->bytes()
                                        : absl::string_view(serialized);
  if (static_cast<int64_t>(weights.size()) > max_model_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, " '", name, "': weights.safetensors would hold ",
        weights.size(), " bytes, over the limit of ", max_model_bytes_,
        " (--max_model_bytes); the model is unchanged"));
  }
  // A fresh hidden folder; a name taken (a leftover of an earlier process
  // with this pid, as in a container) is skipped.
  std::string id;
  std::string temporary;
  absl::Status status;
  for (int attempt = 0; attempt < 100; ++attempt) {
    id = absl::StrCat(getpid(), "-", ++saves_);
    temporary = absl::StrCat(dir_, "/.", name, ".tmp-", id);
    status = fs_->CreateDir(temporary);
    if (!absl::IsAlreadyExists(status)) break;
  }
  if (!status.ok()) return SaveError(field, name, "creating a folder", status);
  // Until the new folder takes the model's place, a failure removes it
  // (best effort: what is left is a leftover, ignored and removed by Load).
  auto abandon = [&](absl::string_view step, const absl::Status& failure) {
    RemoveTree(*fs_, temporary).IgnoreError();
    return SaveError(field, name, step, failure);
  };
  std::string config_text;
  google::protobuf::TextFormat::PrintToString(model.config, &config_text);
  status = WriteDurably(*fs_, temporary + "/weights.safetensors", weights);
  if (!status.ok()) return abandon("writing weights.safetensors", status);
  status = WriteDurably(*fs_, temporary + "/config.pbtxt", config_text);
  if (!status.ok()) return abandon("writing config.pbtxt", status);
  status = fs_->SyncDir(temporary);
  if (!status.ok()) return abandon("syncing the new folder", status);

  absl::StatusOr<FileSystem::Entry> existing = fs_->Stat(folder);
  if (!existing.ok() && !absl::IsNotFound(existing.status())) {
    return abandon("looking for the model's folder", existing.status());
  }
  // Where the old version went: `temporary` after an exchange, or its own
  // hidden name where the file system cannot exchange.
  std::string aside;
  if (!existing.ok()) {
    status = fs_->Rename(temporary, folder);
    if (!status.ok()) return abandon("moving the new folder into place", status);
  } else {
    status = fs_->Exchange(temporary, folder);
    if (status.ok()) {
      aside = temporary;
    } else if (absl::IsUnimplemented(status)) {
      aside = absl::StrCat(dir_, "/.", name, ".old-", id);
      status = fs_->Rename(folder, aside);
      if (!status.ok()) return abandon("moving the old folder aside", status);
      status = fs_->Rename(temporary, folder);
      if (!status.ok()) {
        fs_->Rename(aside, folder).IgnoreError();
        return abandon("moving the new folder into place", status);
      }
    } else {
      return abandon("exchanging the old and new folders", status);
    }
  }
  status = fs_->SyncDir(dir_);
  if (!status.ok()) {
    // Answered as a failure, so the old version must be the one in place.
    if (aside.empty()) {
      fs_->Rename(folder, temporary).IgnoreError();
    } else if (aside == temporary) {
      fs_->Exchange(temporary, folder).IgnoreError();
    } else {
      fs_->Rename(folder, temporary).IgnoreError();
      fs_->Rename(aside, folder).IgnoreError();
    }
    fs_->SyncDir(dir_).IgnoreError();
    return abandon("syncing the repository folder", status);
  }
  // Committed. The old version is garbage now; Load removes it if this
  // does not.
  if (!aside.empty()) RemoveTree(*fs_, aside).IgnoreError();
  return absl::OkStatus();
}

void ModelRepository::ServeFromWrittenFile(const std::string& name,
                                           RepositoryModel* model) {
  absl::StatusOr<std::shared_ptr<const FileBytes>> file = fs_->MapFile(
      dir_ + "/" + name + "/weights.safetensors", max_model_bytes_);
  if (!file.ok() || !(*file)->why_copied().empty()) return;
  absl::StatusOr<std::map<std::string, StoredTensor>> mapped =
      ParseSafetensorsShared(*std::move(file));
  if (!mapped.ok() || mapped->size() != model->tensors.size()) return;
  // Served only if it holds exactly what was written.
  for (const auto& [tensor_name, tensor] : model->tensors) {
    auto it = mapped->find(tensor_name);
    if (it == mapped->end() || it->second.shape != tensor.shape ||
        it->second.is_bfloat16() != tensor.is_bfloat16() ||
        it->second.bytes() != tensor.bytes()) {
      return;
    }
  }
  model->tensors = *std::move(mapped);
  model->weights_mapped = true;
  model->weights_file = nullptr;
}

absl::Status ModelRepository::SaveModel(const SaveNames& names,
                                        const std::string& name,
                                        RepositoryModel model) {
  const std::string& field = names.field;
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": the server runs without --model_repository"));
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", name, "' must be 1-128 letters, digits, '_' or '-'"));
  }
  if (check_model_) RETURN_IF_ERROR(check_model_(name, model));
  const std::string backend = model.config.backend();
  // Disk and memory change together, one save (or load) at a time.
  absl::MutexLock write(&write_mu_);
  if (auto existing = Find(name);
      existing != nullptr && existing->config.backend() != backend) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", name, "' is a ", existing->config.backend(),
        " model; pick another name"));
  }
  // A folder of that name that is not served (it failed to load, or was
  // unloaded) is replaced only if it holds a model of the same backend: a
  // save never destroys another model's files.
  if (Find(name) == nullptr && fs_->Stat(dir_ + "/" + name).ok()) {
    inference::ModelConfig config;
    absl::StatusOr<std::string> text =
        fs_->ReadFile(dir_ + "/" + name + "/config.pbtxt");
    if (!text.ok() ||
        !google::protobuf::TextFormat::ParseFromString(*text, &config) ||
        config.backend() != backend) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", name, "' is a folder of the repository that holds no ",
          names.holding, " (backend '", config.backend(),
          "'); pick another name"));
    }
  }
  RETURN_IF_ERROR(WriteModelFolder(field, name, model));
  if (map_weights_) ServeFromWrittenFile(name, &model);
  model.held_memory = std::make_shared<const attn::HeldMemory>(name);
  auto stored = std::make_shared<const RepositoryModel>(std::move(model));
  absl::MutexLock lock(&mu_);
  models_[name] = std::move(stored);
  unloaded_.erase(name);
  reload_failures_.erase(name);
  return absl::OkStatus();
}

}  // namespace attnserve
