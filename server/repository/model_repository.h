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
// Live model control (Triton's model_repository extension): LoadModel reads
// a folder again (a new or changed model) and serves it; UnloadModel stops
// serving one. Models are shared_ptrs: a call that found a model holds it
// until it is done, so an unloaded or replaced model finishes its calls in
// flight with the weights they started with, and is freed after the last.
//
// Thread-safe: lookups may run concurrently with Save, LoadModel and
// UnloadModel.
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

  // Reads folder `name` (again) and serves its model, replacing any loaded
  // one. INVALID_ARGUMENT for a bad name or a malformed model (the message
  // names the file; a model already served stays served), NOT_FOUND without
  // such a folder, FAILED_PRECONDITION without a repository folder. Blocks
  // on file I/O.
  absl::Status LoadModel(const std::string& name);
  // Stops serving `name` (NOT_FOUND if it is not served); calls holding it
  // finish with it.
  absl::Status UnloadModel(const std::string& name);

  // Every model folder and every served model, by name, with Triton's
  // state: READY (served), UNLOADING (unloaded, calls that hold it still
  // running), UNAVAILABLE (with the reason: unloaded, failed to load, or
  // not loaded yet).
  struct ModelState {
    std::string name;
    std::string state;
    std::string reason;
  };
  std::vector<ModelState> Index() const;

  // Writes and serves a fitted Nadaraya-Watson model `name`. INVALID_ARGUMENT
  // for a bad name or a name taken by another kind of model;
  // FAILED_PRECONDITION without a repository folder; INTERNAL on I/O errors.
  absl::Status SaveBandwidth(const std::string& name, float bandwidth);

 private:
  explicit ModelRepository(std::string dir) : dir_(std::move(dir)) {}

  // The repository's model folders, sorted.
  std::vector<std::string> Folders() const;

  // A model no longer (or never successfully) served, for Index.
  struct Unloaded {
    std::weak_ptr<const RepositoryModel> model;  // expired once freed
    std::string reason;
  };

  const std::string dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const RepositoryModel>> models_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Unloaded> unloaded_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
