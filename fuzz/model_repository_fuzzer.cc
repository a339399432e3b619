// Fuzz target: the model repository loader (attnserve::ModelRepository::Load,
// server/repository/model_repository.cc): config.pbtxt in protobuf text format
// (inference.ModelConfig), the folder-name check, weights.safetensors and
// the per-backend checks of the tensors, as at start-up.
//
// Feeds: one model folder as
//   <config.pbtxt bytes> "\n--- weights.safetensors ---\n" <weights bytes>
// (no separator: the folder has no weights file). The folder is named after
// the config's `name` when that parses and is a plain name (letters, digits,
// '_' and '-'; at most 64), else "model", so that inputs get past the name
// check and still reach it. Written to a private temporary repository (under
// /dev/shm), loaded, then removed.
//
// Asserts, beyond "no crash, no leak, no undefined behaviour":
// - a refused folder is refused with INVALID_ARGUMENT or NOT_FOUND, and the
//   message names the model's folder (the operator must find the file);
// - a loaded repository holds exactly that model, under the folder's name,
//   equal to its config's name; its backend is additive_attention (W_q
//   (h, q), W_k (h, k), w_v (h,), F32), attention_memory (keys (N, d) and
//   values (N, v), both F32 or both BF16) or nadaraya_watson (bandwidth: one
//   finite positive F32 value); every tensor has as many values as its
//   shape's product; the tensors are exactly what ParseSafetensorsShared
//   reads from the file's bytes (the file itself is mapped).
#include <sys/stat.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/common/check.h"
#include "fuzz/common/service_harness.h"
#include "fuzz/common/shapes.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "inference/model_config.pb.h"
#include "server/models/model_catalogue.h"
#include "server/repository/model_repository.h"

namespace {

constexpr char kSeparator[] = "\n--- weights.safetensors ---\n";

bool PlainName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

const std::string& Repository() {
  static const std::string* const dir =
      new std::string(attn_fuzz::MakeTemporaryFolder("attn-fuzz-repository"));
  return *dir;
}

void CheckModel(const std::string& name, const attnserve::RepositoryModel& model,
                const std::string& weights) {
  FUZZ_CHECK(model.config.name() == name, "model '%s' loaded as '%s'",
             model.config.name().c_str(), name.c_str());
  for (const auto& [tensor_name, tensor] : model.tensors) {
    const auto count = attn_fuzz::ElementCount(tensor.shape);
    FUZZ_CHECK(count.has_value() && tensor.num_elements() == *count &&
                   (tensor.data != nullptr) != tensor.is_bfloat16(),
               "tensor '%s': shape %s, values %s", tensor_name.c_str(),
               attn_fuzz::DimsToString(tensor.shape).c_str(),
               tensor.data == nullptr && !tensor.is_bfloat16() ? "none"
                                                               : "given");
  }
  auto rank = [&](const char* tensor_name) -> int64_t {
    auto it = model.tensors.find(tensor_name);
    return it == model.tensors.end()
               ? -1
               : static_cast<int64_t>(it->second.shape.size());
  };
  auto bfloat16 = [&](const char* tensor_name) {
    auto it = model.tensors.find(tensor_name);
    return it != model.tensors.end() && it->second.is_bfloat16();
  };
  const std::string& backend = model.config.backend();
  if (backend == "additive_attention") {
    FUZZ_CHECK(rank("W_q") == 2 && rank("W_k") == 2 && rank("w_v") == 1,
               "additive_attention loaded with ranks %lld, %lld, %lld",
               static_cast<long long>(rank("W_q")),
               static_cast<long long>(rank("W_k")),
               static_cast<long long>(rank("w_v")));
    FUZZ_CHECK(!bfloat16("W_q") && !bfloat16("W_k") && !bfloat16("w_v"),
               "additive_attention loaded with a BF16 tensor");
    const int64_t h = model.tensors.at("W_q").shape[0];
    FUZZ_CHECK(model.tensors.at("W_k").shape[0] == h &&
                   model.tensors.at("w_v").shape[0] == h,
               "additive_attention loaded with different h");
  } else if (backend == "attention_memory") {
    FUZZ_CHECK(rank("keys") == 2 && rank("values") == 2 &&
                   model.tensors.at("keys").shape[0] ==
                       model.tensors.at("values").shape[0] &&
                   bfloat16("keys") == bfloat16("values"),
               "attention_memory loaded with keys and values that differ in "
               "rank, N or dtype");
  } else {
    FUZZ_CHECK(backend == "nadaraya_watson", "backend '%s' loaded",
               backend.c_str());
    FUZZ_CHECK(rank("bandwidth") == 1 && !bfloat16("bandwidth"),
               "bandwidth of rank %lld loaded",
               static_cast<long long>(rank("bandwidth")));
    const attnserve::StoredTensor& w = model.tensors.at("bandwidth");
    FUZZ_CHECK(w.num_elements() == 1 && std::isfinite(w.data[0]) &&
                   w.data[0] > 0,
               "bandwidth %g loaded", static_cast<double>(w.data[0]));
  }
  absl::StatusOr<std::map<std::string, attnserve::StoredTensor>> parsed =
      attnserve::ParseSafetensorsShared(
          attnserve::FileBytesInMemory(weights, "fuzz input"));
  FUZZ_CHECK(parsed.ok(), "loaded weights do not parse alone: %s",
             parsed.status().ToString().c_str());
  FUZZ_CHECK(parsed->size() == model.tensors.size(),
             "%zu tensors loaded, %zu in the file", model.tensors.size(),
             parsed->size());
  for (const auto& [tensor_name, tensor] : *parsed) {
    auto it = model.tensors.find(tensor_name);
    FUZZ_CHECK(it != model.tensors.end() && it->second.shape == tensor.shape &&
                   it->second.is_bfloat16() == tensor.is_bfloat16() &&
                   it->second.bytes() == tensor.bytes(),
               "tensor '%s' loaded differs from the file", tensor_name.c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t separator = input.find(kSeparator);
  const std::string config = input.substr(0, separator);
  const bool has_weights = separator != std::string::npos;
  const std::string weights =
      has_weights ? input.substr(separator + std::strlen(kSeparator)) : "";

  inference::ModelConfig parsed_config;
  std::string name = "model";
  if (google::protobuf::TextFormat::ParseFromString(config, &parsed_config) &&
      PlainName(parsed_config.name())) {
    name = parsed_config.name();
  }
  const std::string& dir = Repository();
  const std::string folder = dir + "/" + name;
  FUZZ_CHECK(mkdir(folder.c_str(), 0700) == 0, "mkdir %s", folder.c_str());
  attn_fuzz::WriteFileOrDie(folder + "/config.pbtxt", config);
  if (has_weights) {
    attn_fuzz::WriteFileOrDie(folder + "/weights.safetensors", weights);
  }

  absl::StatusOr<std::unique_ptr<attnserve::ModelRepository>> repository =
      attnserve::LoadModelRepository(dir);
  attn_fuzz::RemoveTree(folder);
  if (!repository.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(repository.status()) ||
                   absl::IsNotFound(repository.status()),
               "status %s", repository.status().ToString().c_str());
    // The start-up failure names the flag's folder and the model in it
    // (its files relative to the repository: issue #25).
    const std::string where = "--model_repository " + dir + ": " + name;
    FUZZ_CHECK(repository.status().message().find(where) !=
                   absl::string_view::npos,
               "the error does not name '%s': %s", where.c_str(),
               repository.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(has_weights, "a model without weights.safetensors loaded");
  const std::vector<std::string> names = (*repository)->Names();
  FUZZ_CHECK(names.size() == 1 && names[0] == name,
             "%zu models loaded from one folder '%s'", names.size(),
             name.c_str());
  std::shared_ptr<const attnserve::RepositoryModel> model =
      (*repository)->Find(name);
  FUZZ_CHECK(model != nullptr, "Find('%s') after loading it", name.c_str());
  CheckModel(name, *model, weights);
  return 0;
}
