// The model repository: a folder per named model, each holding its
// configuration (config.pbtxt, an inference.ModelConfig in protobuf text
// format) and its weights (weights.safetensors, float32 tensors).
//
// Two kinds of model live there, chosen by the config's `backend`:
// - "additive_attention": tensors W_q (h, q), W_k (h, k), w_v (h);
// - "nadaraya_watson": tensor bandwidth (1), a fitted bandwidth.
// The folder name must equal the config's `name`.
//
// Load validates everything at start-up and fails with a message naming the
// file and the problem. Save writes a fitted Nadaraya-Watson model (both
// files, each through a temporary file and a rename, so a reader never sees
// half a model) and makes it servable at once.
//
// Thread-safe: lookups may run concurrently with Save.
#ifndef ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
#define ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attn/tensor.h"
#include "inference/model_config.pb.h"

namespace attnserve {

struct RepositoryModel {
  inference::ModelConfig config;
  // Weights by name, each with its shape.
  std::map<std::string, attn::Tensor> tensors;
};

// Parses a safetensors file's bytes (8-byte little-endian header length,
// JSON header, data); only F32 tensors. INVALID_ARGUMENT naming the problem.
absl::StatusOr<std::map<std::string, attn::Tensor>> ParseSafetensors(
    const std::string& bytes);
std::string SerializeSafetensors(
    const std::map<std::string, attn::Tensor>& tensors);

class ModelRepository {
 public:
  // An empty `dir` gives an empty repository (Save then fails).
  // INVALID_ARGUMENT / NOT_FOUND naming the file for anything malformed.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Load(
      const std::string& dir);

  // The model, or null.
  std::shared_ptr<const RepositoryModel> Find(const std::string& name) const;
  std::vector<std::string> Names() const;

  // Writes and serves a fitted Nadaraya-Watson model `name`. INVALID_ARGUMENT
  // for a bad name or a name taken by another kind of model;
  // FAILED_PRECONDITION without a repository folder; INTERNAL on I/O errors.
  absl::Status SaveBandwidth(const std::string& name, float bandwidth);

 private:
  explicit ModelRepository(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const RepositoryModel>> models_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
