// The kinds of model attnserve serves (server/models/model_kind.h says
// what a kind is):
//
// - masked_softmax, batch_matmul, dot_product_attention, nadaraya_watson:
//   the built-in models, one each, holding nothing;
// - additive attention: stored models of backend additive_attention,
//   holding their weights W_q (h, q), W_k (h, k), w_v (h), with the tensors
//   of dot_product_attention;
// - fitted Nadaraya-Watson: stored models of backend nadaraya_watson,
//   holding a fitted bandwidth (one finite positive value), with the
//   tensors of the built-in nadaraya_watson (which refuses a "bandwidth"
//   parameter);
// - attention memory: stored models of backend attention_memory, holding a
//   memory of N key-value pairs, keys [N, d] and values [N, v] (finite), and
//   in their config's parameters the `score` (dot_product, the default, or
//   gaussian) and `scale` (default 1/sqrt(d) for the dot product, 1 for the
//   Gaussian); a call sends queries [B, Lq, d] alone and gets output
//   [B, Lq, v] and, on request, attention_weights [B, Lq, N]. Calls on one
//   stored version share its memory: the batcher stacks their queries into
//   one pass over it (server/core/operation.h, MemoryAttentionRequest).
//
// A new kind is one new entry here: the repository checks stored models
// through CheckStoredModel, the catalogue resolves them through
// KindOfBackend, and every front end serves them through the kind.
//
// Every kind lives for the whole process; thread-safe (immutable).
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_KINDS_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_KINDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attn/ops.h"
#include "server/models/model_kind.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// The built-in models' kinds, in the order the catalogue lists them.
const std::vector<const ModelKind*>& BuiltInModelKinds();
// The kinds of stored models.
const ModelKind& AdditiveAttentionKind();
const ModelKind& FittedNadarayaWatsonKind();
const ModelKind& AttentionMemoryKind();

// The kind stored models of `backend` are served as; null for a backend
// no kind has.
const ModelKind* KindOfBackend(absl::string_view backend);

// The repository's check of a stored model (ModelRepository::Options::
// check_model), at load and at save: its backend is a kind's, and it holds
// what that kind needs. INVALID_ARGUMENT starting with `where`.
absl::Status CheckStoredModel(const std::string& where,
                              const RepositoryModel& model);

// Points `op`'s weights at a stored additive attention model's (checked
// when it was stored); the model must outlive the request.
void BindAdditiveWeights(const RepositoryModel& model,
                         attn::AdditiveAttentionRequest* op);

// A fitted Nadaraya-Watson model `name` holding `bandwidth`, to be stored
// (ModelRepository::SaveModel checks it).
RepositoryModel FittedNadarayaWatsonModel(const std::string& name,
                                          float bandwidth);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_KINDS_H_
