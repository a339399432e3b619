// What a kind of model is, whatever front end serves it: the tensors it
// takes and returns (its signature), what a stored model of the kind holds
// (checked once, when the repository loads or saves it), how one call's
// decoded inputs and parameters become the kernel library's request, and
// which of its outputs the result's tensors are.
//
// The kinds themselves are in server/models/model_kinds.h; a model's kind
// is chosen once, when the catalogue resolves its name
// (server/models/model_catalogue.h). Front ends (KServe over gRPC and REST,
// the typed API) only decode into a kind's inputs and encode out of its
// outputs: nothing here knows a wire type.
//
// Plain values; a kind is immutable and lives for the whole process, so it
// is thread-safe.
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_KIND_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_KIND_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "attn/tensor.h"
#include "server/execution/operation.h"
#include "server/models/input_decoding.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// Every served model has this one version; a call naming another is
// NOT_FOUND.
inline constexpr char kServedModelVersion[] = "1";

// One input or output: its name, datatype ("FP32", "INT32"), shape (-1:
// variable; the batch dimension first where there is one) and whether a
// call may leave it out.
struct TensorSpec {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  bool optional = false;
};

// The tensors of a served model, as metadata reports them and as a call's
// inputs are checked against, and the operation whose metrics and limits
// it shares.
struct ModelSignature {
  std::string name;
  Operation operation;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<std::string> default_outputs;  // when a call asks for none
};

// The decoded inputs of one call, by input name. The views point into the
// front end's request or into this object's own storage: keep both alive,
// and this object in place, as long as the views are used.
struct ModelInputs {
  DecodeStorage storage;  // copies the decoding had to make
  std::map<std::string, attn::TensorView> floats;
  std::map<std::string, attn::LengthsView> lengths;
  std::deque<std::vector<int32_t>> owned_lengths;

  // The float input `name`, or an empty view when it was not given (the
  // library then refuses it, naming the argument).
  attn::TensorView Float(const std::string& name) const;
  // The lengths input `name`, or "no valid lengths" when it was not given.
  attn::LengthsView Lengths(const std::string& name) const;
};

// A call's parameters (KServe's request parameters), by name, in the types
// the protocol has; monostate for a parameter given without a value.
using ParameterValue =
    std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string>;
using ModelParameters = std::map<std::string, ParameterValue>;

// What one call's library request is built from. Borrowed for the call.
struct KindArguments {
  const std::string& model_name;  // as served, for errors
  const ModelParameters& parameters;
  const ModelInputs& inputs;  // decoded against the kind's signature
  const RepositoryModel* stored;  // what the model holds; null if built in
  bool return_weights;  // the weights output was asked for
  // The precision the call asked for, where its API has one (the typed
  // API's); unset: the kind's default.
  std::optional<attn::Precision> precision = std::nullopt;
};

// One kind: immutable data and plain functions, so a model's kind is chosen
// by pointing at it, and the per-call work is one indirect call.
struct ModelKind {
  // The library's request for one call, its views pointing into the
  // arguments' inputs and stored model: OK, or INVALID_ARGUMENT for a
  // parameter the kind refuses (the library checks shapes later).
  using BuildRequest =
      absl::StatusOr<OperationRequest> (*)(const KindArguments& arguments);
  // Checks what a stored model holds (its tensors, their shapes and
  // values): OK, or INVALID_ARGUMENT whose message starts with `where`.
  using CheckStored = absl::Status (*)(const std::string& where,
                                       const RepositoryModel& model);
  // The rows an append adds to a stored model of this kind (`name`), from
  // the call's `keys` and `values` (a training set's x and y): checked
  // against what `model` holds and converted to its storage type, by the
  // name of the tensor each extends (ModelRepository::Rows); or
  // INVALID_ARGUMENT naming the field (keys, values) and the shape it must
  // have. The views are the call's, finite (the front end checked).
  using PrepareAppend = absl::StatusOr<ModelRepository::Rows> (*)(
      const std::string& name, const RepositoryModel& model,
      const attn::TensorView& keys, const attn::TensorView& values);
  // Writes the dimensions a checked stored model fixes into its signature
  // (the -1s of the kind's), so that metadata and the model config tell a
  // client what the model takes and returns.
  using StoredDimensions = void (*)(const RepositoryModel& model,
                                    ModelSignature* signature);

  // The tensors; `signature.name` is the built-in model's name (a stored
  // model is served under its own).
  ModelSignature signature;
  // The repository's `backend` for stored models of this kind, and their
  // check; empty and null for a built-in kind.
  std::string backend;
  CheckStored check_stored = nullptr;
  StoredDimensions stored_dimensions = nullptr;  // null: the kind's stand
  PrepareAppend prepare_append = nullptr;  // null: its models never grow
  // The tensors whose rows appends add and evictions drop, all [N, ...]
  // with one N; empty when prepare_append is null.
  std::vector<std::string> row_tensors;
  BuildRequest build_request = nullptr;
  // The outputs the result's `output` and `weights` are returned as; every
  // output of the signature is one of them. `weights_output` is empty when
  // the operation computes no weights.
  std::string result_output;
  std::string weights_output;
  // The library's argument names in its errors, by the inputs they are
  // (the library's "x:" is masked_softmax's input 'X'); most kinds name
  // their arguments as their inputs and have none.
  std::vector<std::pair<std::string, std::string>> argument_inputs;
  // Whether a model config declares the first dimension a batch dimension
  // (max_batch_size, dynamic_batching): dot_product_attention's only, as
  // Triton's tools expect it. The batcher batches every kind regardless.
  bool config_batch_dimension = false;
  // Its build_request reads its row tensors held in pieces
  // (StoredTensor::pieces), so the repository need not copy a grown
  // model's rows into one piece (ModelRepository::Options::
  // grows_in_pieces). Every other check and read of the kind's serves
  // both forms.
  bool reads_pieces = false;
  // Its calls gain from batching whatever else runs (a stored memory's: a
  // batch reads the memory once for all its queries), so the server batches
  // them by default (CallContext::gains_from_batching).
  bool gains_from_batching = false;

  bool built_in() const { return backend.empty(); }
  // The result's tensors by output name.
  std::map<std::string, const attn::Tensor*> ResultTensors(
      const attn::OpResult& result) const;
  // `status` with the library's argument names replaced by the input names
  // (see argument_inputs); unchanged when OK or naming no argument.
  absl::Status WithInputNames(absl::Status status) const;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_KIND_H_
