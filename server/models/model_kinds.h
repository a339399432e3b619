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
// - trained Nadaraya-Watson: stored models of backend nadaraya_watson that
//   also hold the training set they were fitted on, x_train [N] or [N, dx]
//   and y_train [N] or [N, dy] (FitBandwidth's save_as stores one): a call
//   sends x_query alone and gets y_pred (and, on request,
//   attention_weights), the textbook's net(x_test, keys, values). Calls on
//   one stored version share its training set: with --batching the batcher
//   concatenates their queries (server/execution/operation.h, StoredRequest);
//   not by default, where it was measured not to
//   pay.
//   Either Nadaraya-Watson model may set a `kernel` config parameter
//   (gaussian, boxcar, constant, epanechnikov); it then serves that kernel
//   and refuses a call's.
// - attention memory: stored models of backend attention_memory, holding a
//   memory of N key-value pairs, keys [N, d] and values [N, v] (finite), and
//   in their config's parameters the `score` (dot_product, the default, or
//   gaussian), `scale` (default 1/sqrt(d) for the dot product, 1 for the
//   Gaussian) and `max_rows` when it keeps a window of its newest rows
//   (ModelRepository's MaxRowsOf, which a trained Nadaraya-Watson model may
//   set too); a call sends queries [B, Lq, d] alone and gets output
//   [B, Lq, v] and, on request, attention_weights [B, Lq, N]. Calls on one
//   stored version share its memory: the batcher stacks their queries into
//   one pass over it (server/execution/operation.h, StoredRequest).
//
// A new kind is one new entry here: the repository checks stored models
// through CheckStoredModel, the catalogue resolves them through
// KindOfBackend, and every front end serves them through the kind.
//
// Every kind lives for the whole process; thread-safe (immutable).
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_KINDS_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_KINDS_H_

#include <optional>
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
const ModelKind& TrainedNadarayaWatsonKind();
const ModelKind& AttentionMemoryKind();

// The kind whose check stored models of `backend` pass (for
// nadaraya_watson, the fitted kind's, which also checks a training set);
// null for a backend no kind has.
const ModelKind* KindOfBackend(absl::string_view backend);
// The kind a stored model (checked) is served as: its backend's, or for a
// nadaraya_watson model holding a training set, the trained kind.
const ModelKind* KindOfStored(const RepositoryModel& model);

// The repository's check of a stored model (ModelRepository::Options::
// check_model), at load and at save: its backend is a kind's, and it holds
// what that kind needs. INVALID_ARGUMENT starting with `where`.
absl::Status CheckStoredModel(const std::string& where,
                              const RepositoryModel& model);
// Whether the repository may hold a stored model's grown tensors in pieces
// (ModelRepository::Options::grows_in_pieces): its kind reads them so.
bool ReadsPieces(const RepositoryModel& model);

// Stored models that hold rows grow by appends (ModelKind::prepare_append,
// ModelCatalogue::Append): an attention memory's keys and values, and a
// trained Nadaraya-Watson model's training set (x_train and y_train, sent
// as an append's keys and values).
//
// What a memory made by its first append is: its score and scale (unset:
// the score's default), and whether it stores its rows as bfloat16.
struct MemorySettings {
  attn::ScoreKind score = attn::ScoreKind::kDotProduct;
  std::optional<float> scale;
  bool bfloat16 = false;
  // The most rows it keeps (its `max_rows` parameter, a first-in-first-out
  // window: appends drop the oldest beyond it); 0: no window.
  int64_t max_rows = 0;
};
// A new attention memory `name` of `keys` [n, d] and `values` [n, v]
// (copied, rounded to bfloat16 when the settings say so; only the last
// max_rows of them with a window) and `settings`,
// to be stored (ModelRepository::AppendRows checks it). INVALID_ARGUMENT
// naming the field for shapes that do not make a memory or a scale that is
// not finite and positive.
absl::StatusOr<RepositoryModel> NewAttentionMemory(
    const std::string& name, const MemorySettings& settings,
    const attn::TensorView& keys, const attn::TensorView& values);
// OK when the stored model `model` (`name`) is an attention memory with
// `settings`; else INVALID_ARGUMENT naming `field` and what it holds.
absl::Status CheckMemorySettings(absl::string_view field,
                                 const std::string& name,
                                 const RepositoryModel& model,
                                 const MemorySettings& settings);

// A fitted Nadaraya-Watson model `name` holding `bandwidth`, to be stored
// (ModelRepository::SaveModel checks it).
RepositoryModel FittedNadarayaWatsonModel(const std::string& name,
                                          float bandwidth);
// The same holding also the training set it was fitted on (copied), with
// the Gaussian kernel the fit used: it answers x_query alone.
RepositoryModel TrainedNadarayaWatsonModel(const std::string& name,
                                           float bandwidth,
                                           attn::TensorView x_train,
                                           attn::TensorView y_train);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_KINDS_H_
