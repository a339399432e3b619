#include "server/repository/model_repository.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace attnserve {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& bytes) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!file) return absl::InternalError(absl::StrCat(temporary, ": write failed"));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat(path, ": rename failed: ",
                                            std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

// Checks a loaded model's tensors against its backend.
absl::Status CheckModel(const std::string& where, const RepositoryModel& model) {
  const std::string& backend = model.config.backend();
  auto tensor = [&](const std::string& name, size_t rank)
      -> absl::StatusOr<const attn::Tensor*> {
    auto it = model.tensors.find(name);
    if (it == model.tensors.end() || it->second.shape.size() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": backend ", backend, " needs a rank-", rank, " tensor '",
          name, "' in weights.safetensors"));
    }
    return &it->second;
  };
  if (backend == "additive_attention") {
    ASSIGN_OR_RETURN(const attn::Tensor* w_q, tensor("W_q", 2));
    ASSIGN_OR_RETURN(const attn::Tensor* w_k, tensor("W_k", 2));
    ASSIGN_OR_RETURN(const attn::Tensor* w_v, tensor("w_v", 1));
    if (w_k->shape[0] != w_q->shape[0] || w_v->shape[0] != w_q->shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": W_q ", attn::ShapeToString(w_q->shape), ", W_k ",
          attn::ShapeToString(w_k->shape), " and w_v ",
          attn::ShapeToString(w_v->shape), " must share their first dimension h"));
    }
    return absl::OkStatus();
  }
  if (backend == "nadaraya_watson") {
    ASSIGN_OR_RETURN(const attn::Tensor* w, tensor("bandwidth", 1));
    if (w->data.size() != 1 || !(w->data[0] > 0) || !std::isfinite(w->data[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": bandwidth must hold one finite positive value"));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": backend '", backend,
      "' is not one of additive_attention, nadaraya_watson"));
}

// A JSON number that must be a count (a dimension, a byte offset): JSON
// has only doubles, so 20.5, -1 and 1e30 parse too; each is refused rather
// than cast (a cast truncates, and one past int64 is undefined).
absl::StatusOr<int64_t> JsonCount(absl::string_view field,
                                  const google::protobuf::Value& value) {
  constexpr double kLargest = 9007199254740992.0;  // 2^53: exact in a double
  const double number = value.number_value();
  if (value.kind_case() != google::protobuf::Value::kNumberValue ||
      !(number >= 0.0 && number <= kLargest) || std::floor(number) != number) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: ", field, " must hold whole numbers in [0, 2^53], got ",
        value.kind_case() == google::protobuf::Value::kNumberValue
            ? absl::StrCat(number)
            : std::string("a non-number")));
  }
  return static_cast<int64_t>(number);
}

}  // namespace

absl::StatusOr<std::map<std::string, attn::Tensor>> ParseSafetensors(
    const std::string& bytes) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError("safetensors: shorter than its header");
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: header of ", header_size, " bytes runs past the file"));
  }
  google::protobuf::Struct header;
  if (!google::protobuf::util::JsonStringToMessage(
           bytes.substr(8, header_size), &header)
           .ok()) {
    return absl::InvalidArgumentError("safetensors: the header is not JSON");
  }
  const size_t data_begin = 8 + header_size;
  const size_t data_size = bytes.size() - data_begin;
  std::map<std::string, attn::Tensor> tensors;
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") continue;
    const auto& fields = value.struct_value().fields();
    auto dtype = fields.find("dtype");
    auto shape = fields.find("shape");
    auto offsets = fields.find("data_offsets");
    if (dtype == fields.end() || shape == fields.end() || offsets == fields.end() ||
        offsets->second.list_value().values_size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    if (dtype->second.string_value() != "F32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' is ", dtype->second.string_value(),
          "; only F32 is served"));
    }
    attn::Tensor tensor;
    for (const auto& dim : shape->second.list_value().values()) {
      ASSIGN_OR_RETURN(const int64_t size,
                       JsonCount(absl::StrCat("tensor '", name, "' shape"), dim));
      tensor.shape.push_back(size);
    }
    ASSIGN_OR_RETURN(const int64_t count,
                     attn::CheckedNumElements(name, tensor.shape));
    const std::string offsets_field =
        absl::StrCat("tensor '", name, "' data_offsets");
    ASSIGN_OR_RETURN(const int64_t begin,
                     JsonCount(offsets_field,
                               offsets->second.list_value().values(0)));
    ASSIGN_OR_RETURN(const int64_t end,
                     JsonCount(offsets_field,
                               offsets->second.list_value().values(1)));
    if (end > static_cast<int64_t>(data_size) || end - begin != 4 * count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' data_offsets [", begin, ", ", end,
          ") do not hold ", count, " float32 values inside the ", data_size,
          "-byte data"));
    }
    tensor.data.resize(count);
    std::memcpy(tensor.data.data(),
                bytes.data() + data_begin + static_cast<size_t>(begin), 4 * count);
    tensors[name] = std::move(tensor);
  }
  return tensors;
}

std::string SerializeSafetensors(
    const std::map<std::string, attn::Tensor>& tensors) {
  std::string header = "{";
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (int64_t dim : tensor.shape) {
      absl::StrAppend(&shape, shape.empty() ? "" : ",", dim);
    }
    absl::StrAppend(&header, "\"", name, "\":{\"dtype\":\"F32\",\"shape\":[",
                    shape, "],\"data_offsets\":[", data.size(), ",",
                    data.size() + 4 * tensor.data.size(), "]}");
    data.append(reinterpret_cast<const char*>(tensor.data.data()),
                4 * tensor.data.size());
  }
  header += "}";
  while (header.size() % 8 != 0) header += " ";  // the format's alignment
  const uint64_t size = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &size, 8);
  return bytes + header + data;
}

namespace {

// Reads and checks the model in `folder`, whose name is `name`.
absl::StatusOr<std::shared_ptr<const RepositoryModel>> ReadModel(
    const std::string& folder, const std::string& name) {
  auto model = std::make_shared<RepositoryModel>();
  ASSIGN_OR_RETURN(const std::string config_text,
                   ReadFile(folder + "/config.pbtxt"));
  if (!google::protobuf::TextFormat::ParseFromString(config_text,
                                                     &model->config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        folder, "/config.pbtxt: not an inference.ModelConfig in protobuf "
                "text format"));
  }
  if (model->config.name() != name) {
    return absl::InvalidArgumentError(absl::StrCat(
        folder, "/config.pbtxt: name '", model->config.name(),
        "' differs from its folder's name"));
  }
  ASSIGN_OR_RETURN(const std::string weights,
                   ReadFile(folder + "/weights.safetensors"));
  absl::StatusOr<std::map<std::string, attn::Tensor>> tensors =
      ParseSafetensors(weights);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        folder, "/weights.safetensors: ", tensors.status().message()));
  }
  model->tensors = *std::move(tensors);
  RETURN_IF_ERROR(CheckModel(folder, *model));
  return std::shared_ptr<const RepositoryModel>(std::move(model));
}

}  // namespace

std::vector<std::string> ModelRepository::Folders() const {
  std::vector<std::string> names;
  DIR* handle = opendir(dir_.c_str());
  if (handle == nullptr) return names;
  while (dirent* entry = readdir(handle)) {
    const std::string name = entry->d_name;
    struct stat info;
    if (name[0] == '.' || stat((dir_ + "/" + name).c_str(), &info) != 0 ||
        !S_ISDIR(info.st_mode)) {
      continue;
    }
    names.push_back(name);
  }
  closedir(handle);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(
    const std::string& dir) {
  std::unique_ptr<ModelRepository> repository(new ModelRepository(dir));
  if (dir.empty()) return repository;
  DIR* handle = opendir(dir.c_str());
  if (handle == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "--model_repository ", dir, ": cannot open the folder"));
  }
  closedir(handle);
  const std::vector<std::string> names = repository->Folders();
  absl::MutexLock lock(&repository->mu_);
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(repository->models_[name],
                     ReadModel(dir + "/" + name, name));
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
  const std::string folder = dir_ + "/" + name;
  struct stat info;
  if (stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::NotFoundError(absl::StrCat(
        "model_name: no folder '", name, "' in the model repository"));
  }
  absl::StatusOr<std::shared_ptr<const RepositoryModel>> model =
      ReadModel(folder, name);
  absl::MutexLock lock(&mu_);
  if (!model.ok()) {
    // What serves stays (a half-copied folder never takes a model away).
    unloaded_[name].reason =
        absl::StrCat("failed to load: ", model.status().message());
    return absl::Status(model.status().code(),
                        absl::StrCat("failed to load '", name,
                                     "': ", model.status().message()));
  }
  models_[name] = *std::move(model);
  unloaded_.erase(name);
  return absl::OkStatus();
}

absl::Status ModelRepository::UnloadModel(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model_name: '", name, "' is not loaded"));
  }
  unloaded_[name] = Unloaded{it->second, "unloaded"};
  models_.erase(it);
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
    if (models_.count(name) == 0) {
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

absl::Status ModelRepository::SaveBandwidth(const std::string& name,
                                            float bandwidth) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        "save_as: the server runs without --model_repository");
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "save_as: '", name, "' must be 1-128 letters, digits, '_' or '-'"));
  }
  if (auto existing = Find(name);
      existing != nullptr && existing->config.backend() != "nadaraya_watson") {
    return absl::InvalidArgumentError(absl::StrCat(
        "save_as: '", name, "' is a ", existing->config.backend(),
        " model; pick another name"));
  }
  auto model = std::make_shared<RepositoryModel>();
  model->config.set_name(name);
  model->config.set_platform("attnserve");
  model->config.set_backend("nadaraya_watson");
  attn::Tensor w = attn::Tensor::Zeros({1});
  w.data[0] = bandwidth;
  model->tensors["bandwidth"] = std::move(w);
  RETURN_IF_ERROR(CheckModel(name, *model));
  const std::string folder = dir_ + "/" + name;
  if (mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat(folder, ": ", std::strerror(errno)));
  }
  std::string config_text;
  google::protobuf::TextFormat::PrintToString(model->config, &config_text);
  RETURN_IF_ERROR(WriteFileAtomically(folder + "/weights.safetensors",
                                      SerializeSafetensors(model->tensors)));
  RETURN_IF_ERROR(WriteFileAtomically(folder + "/config.pbtxt", config_text));
  absl::MutexLock lock(&mu_);
  models_[name] = std::move(model);
  unloaded_.erase(name);
  return absl::OkStatus();
}

}  // namespace attnserve
