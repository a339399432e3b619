// The kinds of model the KServe v2 service serves, each with everything
// that differs between them: its tensors, how its decoded inputs become the
// library's request, and which of its outputs the result's tensors are.
//
// - masked_softmax, batch_matmul, dot_product_attention, nadaraya_watson:
//   the built-in models, one each;
// - additive attention: a repository model of backend additive_attention,
//   with its weights W_q, W_k, w_v and the tensors of dot_product_attention;
// - fitted Nadaraya-Watson: a repository model of backend nadaraya_watson,
//   with its fitted bandwidth and the tensors of the built-in
//   nadaraya_watson (which refuses a "bandwidth" parameter).
// A model's kind is chosen once, when it is resolved
// (server/api/kserve_models.h); the kinds are the only ones there are, so
// no call can name an operation that has none.
//
// Every kind lives for the whole process; thread-safe (immutable).
#ifndef ATTNSERVE_SERVER_API_KSERVE_MODEL_KINDS_H_
#define ATTNSERVE_SERVER_API_KSERVE_MODEL_KINDS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "inference/grpc_service.pb.h"
#include "server/api/kserve_codec.h"
#include "server/api/kserve_model_spec.h"
#include "server/core/batchable.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// What one call's library request is built from. Borrowed for the call.
struct KindArguments {
  const std::string& model_name;  // as served, for errors
  const inference::ModelInferRequest& request;  // for its parameters
  const KServeInputs& inputs;  // decoded against the kind's spec
  const RepositoryModel* repository_model;  // its weights; null if built in
  bool return_weights;  // attention_weights was asked for
};

// One kind: immutable data and a plain function, so a model's kind is
// chosen by pointing at it, and the per-call work is one indirect call.
struct ModelKind {
  // The library's request for one call, its views pointing into the
  // arguments' inputs and repository model: OK, or INVALID_ARGUMENT for a
  // parameter the kind refuses (the library checks shapes later).
  using BuildRequest =
      absl::StatusOr<BatchableRequest> (*)(const KindArguments& arguments);

  // The tensors; `spec.name` is the built-in model's name (a repository
  // model is served under its own).
  KServeModelSpec spec;
  BuildRequest build_request;
  // The outputs the result's `output` and `weights` are returned as; every
  // output of `spec` is one of them. `weights_output` is empty when the
  // operation computes no weights.
  std::string result_output;
  std::string weights_output;
  // The library's argument names in its errors, by the inputs they are
  // (the library's "x:" is masked_softmax's input 'X'); most kinds name
  // their arguments as their inputs and have none.
  std::vector<std::pair<std::string, std::string>> argument_inputs;
  // Whether ModelConfig declares the first dimension a batch dimension
  // (max_batch_size, dynamic_batching): dot_product_attention's only, as
  // Triton's tools expect it. The batcher batches every kind regardless.
  bool config_batch_dimension = false;

  // The result's tensors by output name, for Respond (kserve_codec.h).
  std::map<std::string, const attn::Tensor*> ResultTensors(
      const attn::OpResult& result) const;
  // `status` with the library's argument names replaced by the input names
  // (see argument_inputs); unchanged when OK or naming no argument.
  absl::Status WithInputNames(absl::Status status) const;
};

// The built-in models' kinds, in the order the catalogue lists them.
const std::vector<const ModelKind*>& BuiltInModelKinds();
// The repository's two backends.
const ModelKind& AdditiveAttentionKind();
const ModelKind& FittedNadarayaWatsonKind();

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_KSERVE_MODEL_KINDS_H_
