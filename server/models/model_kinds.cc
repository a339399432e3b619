#include "server/models/model_kinds.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attn/bfloat16.h"
#include "attn/status_macros.h"

namespace attnserve {
namespace {

// A config parameter's text as a number, the whole of it.
std::optional<double> ParseNumber(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

// The parameters the Nadaraya-Watson kinds read. A parameter of the wrong
// type or value is INVALID_ARGUMENT naming it; parameters no kind reads are
// ignored, as Triton does.

// "kernel" (a string): gaussian (the default), boxcar, constant or
// epanechnikov.
absl::StatusOr<attn::RegressionKernel> KernelParameter(
    const ModelParameters& parameters) {
  auto it = parameters.find("kernel");
  if (it == parameters.end()) return attn::RegressionKernel::kGaussian;
  const std::string* given = std::get_if<std::string>(&it->second);
  const std::string kernel = given != nullptr ? *given : "";
  if (kernel == "gaussian") return attn::RegressionKernel::kGaussian;
  if (kernel == "boxcar") return attn::RegressionKernel::kBoxcar;
  if (kernel == "constant") return attn::RegressionKernel::kConstant;
  if (kernel == "epanechnikov") return attn::RegressionKernel::kEpanechnikov;
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter 'kernel': '", kernel,
      "' is not one of gaussian, boxcar, constant, epanechnikov"));
}

// A stored model's `kernel` config parameter, if it sets one (the same
// names); INVALID_ARGUMENT starting with `where` for any other value.
absl::StatusOr<std::optional<attn::RegressionKernel>> StoredKernel(
    const std::string& where, const RepositoryModel& model) {
  const auto& parameters = model.config.parameters();
  auto it = parameters.find("kernel");
  if (it == parameters.end()) return std::nullopt;
  ModelParameters as_call{{"kernel", it->second.string_value()}};
  absl::StatusOr<attn::RegressionKernel> kernel = KernelParameter(as_call);
  if (!kernel.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", kernel.status().message()));
  }
  return *kernel;
}

// "bandwidth" (a double or an int64); 1 when not given.
absl::StatusOr<float> BandwidthParameter(const ModelParameters& parameters) {
  auto it = parameters.find("bandwidth");
  if (it == parameters.end()) return 1.0f;
  if (const double* value = std::get_if<double>(&it->second)) {
    return static_cast<float>(*value);
  }
  if (const int64_t* value = std::get_if<int64_t>(&it->second)) {
    return static_cast<float>(*value);
  }
  return absl::InvalidArgumentError(
      "parameter 'bandwidth': must be a number (double_param)");
}

// The tensors of the attention models, built in and additive alike.
ModelSignature AttentionSignature(const std::string& name,
                                  Operation operation) {
  return {name,
          operation,
          {{"queries", "FP32", {-1, -1, -1}},
           {"keys", "FP32", {-1, -1, -1}},
           {"values", "FP32", {-1, -1, -1}},
           // [B], [B, Lq], or Triton's per-item form [B, 1] (batch dim
           // first).
           {"valid_lens", "INT32", {-1, -1}, true}},
          {{"output", "FP32", {-1, -1, -1}},
           {"attention_weights", "FP32", {-1, -1, -1}}},
          {"output"}};
}

ModelSignature NadarayaWatsonSignature() {
  return {"nadaraya_watson",
          Operation::kNadarayaWatson,
          {{"x_train", "FP32", {-1}},
           {"y_train", "FP32", {-1}},
           {"x_query", "FP32", {-1}}},
          {{"y_pred", "FP32", {-1}}, {"attention_weights", "FP32", {-1, -1}}},
          {"y_pred"}};
}

// A stored model's tensor `name` of rank `rank`, or INVALID_ARGUMENT
// naming the backend and what it needs.
// F32 unless `bfloat16_too`.
absl::StatusOr<const StoredTensor*> RequiredTensor(const std::string& where,
                                                   const RepositoryModel& model,
                                                   const std::string& name,
                                                   size_t rank,
                                                   bool bfloat16_too = false) {
  auto it = model.tensors.find(name);
  if (it == model.tensors.end() || it->second.shape.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": backend ", model.config.backend(), " needs a rank-", rank,
        " tensor '", name, "' in weights.safetensors"));
  }
  if (it->second.is_bfloat16() && !bfloat16_too) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": tensor '", name, "' is BF16; backend ",
        model.config.backend(), " holds F32 tensors only"));
  }
  return &it->second;
}

absl::Status CheckAdditiveAttention(const std::string& where,
                                    const RepositoryModel& model) {
  ASSIGN_OR_RETURN(const StoredTensor* w_q,
                   RequiredTensor(where, model, "W_q", 2));
  ASSIGN_OR_RETURN(const StoredTensor* w_k,
                   RequiredTensor(where, model, "W_k", 2));
  ASSIGN_OR_RETURN(const StoredTensor* w_v,
                   RequiredTensor(where, model, "w_v", 1));
  if (w_k->shape[0] != w_q->shape[0] || w_v->shape[0] != w_q->shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": W_q ", attn::ShapeToString(w_q->shape), ", W_k ",
        attn::ShapeToString(w_k->shape), " and w_v ",
        attn::ShapeToString(w_v->shape),
        " must share their first dimension h"));
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(const std::string& where, const std::string& name,
                         const StoredTensor& tensor, const char* holder) {
  auto refuse = [&](size_t i, float value) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor '", name, "' element ", i, " is ", value,
                     "; ", holder, " holds finite values only"));
  };
  size_t first = 0;  // the part's first element in the whole
  for (const StoredTensor& part : tensor.parts()) {
    const size_t count = static_cast<size_t>(part.num_elements());
    if (part.is_bfloat16()) {
      for (size_t i = 0; i < count; ++i) {
        // All exponent bits set: infinity or NaN.
        if ((part.bfloat16[i] & 0x7f80) == 0x7f80) {
          return refuse(first + i, attn::WidenBFloat16(part.bfloat16[i]));
        }
      }
    } else {
      const absl::Span<const float> values = part.values();
      for (size_t i = 0; i < values.size(); ++i) {
        if (!std::isfinite(values[i])) return refuse(first + i, values[i]);
      }
    }
    first += count;
  }
  return absl::OkStatus();
}

// A model's rows (tensor `rows`) within its max_rows window, if it sets one
// (the repository keeps it there as appends come; a model saved whole must
// fit it).
absl::Status CheckWithinMaxRows(const std::string& where,
                                const RepositoryModel& model,
                                const std::string& rows) {
  ASSIGN_OR_RETURN(const int64_t max_rows, MaxRowsOf(where, model));
  const int64_t held = model.tensors.at(rows).shape[0];
  if (max_rows > 0 && held > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", held, " rows, over its parameter 'max_rows' (",
        max_rows, ")"));
  }
  return absl::OkStatus();
}

bool HoldsTrainingSet(const RepositoryModel& model) {
  return model.tensors.count("x_train") > 0 ||
         model.tensors.count("y_train") > 0;
}

// A stored Nadaraya-Watson model: its bandwidth, and optionally the
// training set it was fitted on (both x_train [N] or [N, dx] and y_train
// [N] or [N, dy], finite, N >= 1) and a `kernel` config parameter.
absl::Status CheckNadarayaWatsonModel(const std::string& where,
                                      const RepositoryModel& model) {
  ASSIGN_OR_RETURN(const StoredTensor* w,
                   RequiredTensor(where, model, "bandwidth", 1));
  if (w->num_elements() != 1 || !(w->data[0] > 0) || !std::isfinite(w->data[0])) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": bandwidth must hold one finite positive value"));
  }
  RETURN_IF_ERROR(StoredKernel(where, model).status());
  if (!HoldsTrainingSet(model)) return absl::OkStatus();
  const StoredTensor* set[2] = {nullptr, nullptr};
  const char* const names[2] = {"x_train", "y_train"};
  for (int i = 0; i < 2; ++i) {
    auto it = model.tensors.find(names[i]);
    if (it == model.tensors.end() || it->second.shape.empty() ||
        it->second.shape.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a nadaraya_watson model with a training set holds both "
          "x_train [N] or [N, dx] and y_train [N] or [N, dy]; '", names[i],
          "' is ",
          it == model.tensors.end() ? std::string("missing")
                                    : absl::StrCat("of shape ",
                                                   attn::ShapeToString(
                                                       it->second.shape))));
    }
    if (it->second.is_bfloat16()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", names[i], "' is BF16; a training set is F32"));
    }
    set[i] = &it->second;
  }
  if (set[0]->shape[0] != set[1]->shape[0] || set[0]->shape[0] < 1 ||
      set[0]->values().empty() || set[1]->values().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": x_train ", attn::ShapeToString(set[0]->shape),
        " and y_train ", attn::ShapeToString(set[1]->shape),
        " must hold the same N >= 1 points, each of at least one value"));
  }
  RETURN_IF_ERROR(CheckFinite(where, "x_train", *set[0], "a training set"));
  RETURN_IF_ERROR(CheckFinite(where, "y_train", *set[1], "a training set"));
  return CheckWithinMaxRows(where, model, "x_train");
}

absl::StatusOr<OperationRequest> BuildMaskedSoftmax(
    const KindArguments& arguments) {
  attn::MaskedSoftmaxRequest op;
  op.x = arguments.inputs.Float("X");
  op.valid_lens = arguments.inputs.Lengths("valid_lens");
  return op;
}

absl::StatusOr<OperationRequest> BuildBatchMatmul(
    const KindArguments& arguments) {
  attn::BatchMatmulRequest op;
  op.a = arguments.inputs.Float("X");
  op.b = arguments.inputs.Float("Y");
  return op;
}

absl::StatusOr<OperationRequest> BuildDotProductAttention(
    const KindArguments& arguments) {
  attn::AttentionRequest op;
  op.queries = arguments.inputs.Float("queries");
  op.keys = arguments.inputs.Float("keys");
  op.values = arguments.inputs.Float("values");
  op.valid_lens = arguments.inputs.Lengths("valid_lens");
  op.return_weights = arguments.return_weights;
  return op;
}

// Points `op`'s weights at a stored additive attention model's (checked
// when it was stored); the model must outlive the request.
void BindAdditiveWeights(const RepositoryModel& model,
                         attn::AdditiveAttentionRequest* op) {
  op->w_q = model.tensors.at("W_q").view();
  op->w_k = model.tensors.at("W_k").view();
  op->w_v = model.tensors.at("w_v").view();
}

absl::StatusOr<OperationRequest> BuildAdditiveAttention(
    const KindArguments& arguments) {
  attn::AdditiveAttentionRequest op;
  op.queries = arguments.inputs.Float("queries");
  op.keys = arguments.inputs.Float("keys");
  op.values = arguments.inputs.Float("values");
  op.valid_lens = arguments.inputs.Lengths("valid_lens");
  BindAdditiveWeights(*arguments.stored, &op);
  op.return_weights = arguments.return_weights;
  return op;
}

// The inputs and kernel of every Nadaraya-Watson kind; the bandwidth is
// the caller's to set. A stored model whose config sets a kernel serves
// that one: a call's would silently replace it, so one given is refused.
absl::StatusOr<attn::NadarayaWatsonRequest> NadarayaWatsonInputs(
    const KindArguments& arguments) {
  attn::NadarayaWatsonRequest op;
  op.x_train = arguments.inputs.Float("x_train");
  op.y_train = arguments.inputs.Float("y_train");
  op.x_query = arguments.inputs.Float("x_query");
  ASSIGN_OR_RETURN(op.kernel, KernelParameter(arguments.parameters));
  if (arguments.stored != nullptr) {
    ASSIGN_OR_RETURN(std::optional<attn::RegressionKernel> stored,
                     StoredKernel(arguments.model_name, *arguments.stored));
    if (stored.has_value()) {
      if (arguments.parameters.count("kernel")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter 'kernel': model '", arguments.model_name,
            "' serves its own kernel, ",
            attn::RegressionKernelName(*stored)));
      }
      op.kernel = *stored;
    }
  }
  op.return_weights = arguments.return_weights;
  return op;
}

absl::StatusOr<OperationRequest> BuildNadarayaWatson(
    const KindArguments& arguments) {
  ASSIGN_OR_RETURN(attn::NadarayaWatsonRequest op,
                   NadarayaWatsonInputs(arguments));
  ASSIGN_OR_RETURN(op.bandwidth, BandwidthParameter(arguments.parameters));
  return op;
}

// A fitted model serves its own bandwidth: a caller's would silently
// replace what was fitted, so one given is refused.
absl::StatusOr<OperationRequest> BuildFittedNadarayaWatson(
    const KindArguments& arguments) {
  ASSIGN_OR_RETURN(attn::NadarayaWatsonRequest op,
                   NadarayaWatsonInputs(arguments));
  if (arguments.parameters.count("bandwidth")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter 'bandwidth': model '", arguments.model_name,
        "' serves its fitted bandwidth"));
  }
  op.bandwidth = arguments.stored->tensors.at("bandwidth").data[0];
  return op;
}

// A model that holds its training set takes the queries alone: the call's
// x_query against the stored x_train and y_train, with the fitted
// bandwidth. Calls on one stored version share the set, so a batcher
// concatenates their queries (server/execution/operation.h, StoredRequest).
absl::StatusOr<OperationRequest> BuildTrainedNadarayaWatson(
    const KindArguments& arguments) {
  ASSIGN_OR_RETURN(OperationRequest fitted,
                   BuildFittedNadarayaWatson(arguments));
  attn::NadarayaWatsonRequest regression =
      std::get<attn::NadarayaWatsonRequest>(std::move(fitted));
  regression.x_train = arguments.stored->tensors.at("x_train").view();
  regression.y_train = arguments.stored->tensors.at("y_train").view();
  // y_pred [m] or [m, dy], as the set's y_train; weights [m, N].
  const attn::Shape& y = regression.y_train.shape;
  const int64_t m =
      regression.x_query.rank() >= 1 ? regression.x_query.shape[0] : 0;
  attn::Shape output_shape = y.size() == 1 ? attn::Shape{m}
                                           : attn::Shape{m, y.back()};
  attn::Shape weights_shape = {m, regression.x_train.shape.front()};
  return StoredRequest{std::move(regression), arguments.stored,
                       /*lineage=*/nullptr, std::move(output_shape),
                       std::move(weights_shape)};
}

// An attention memory's score and scale, from its config's parameters:
// `score` dot_product (the default) or gaussian; `scale` a finite positive
// number (default: 1/sqrt(d) for the dot product, 1 for the Gaussian, as
// the typed API's).
struct MemoryScoring {
  attn::ScoreKind score = attn::ScoreKind::kDotProduct;
  std::optional<float> scale;
};

absl::StatusOr<MemoryScoring> ScoringOf(const std::string& where,
                                        const RepositoryModel& model) {
  MemoryScoring scoring;
  const auto& parameters = model.config.parameters();
  if (auto it = parameters.find("score"); it != parameters.end()) {
    const std::string& score = it->second.string_value();
    if (score == "gaussian") {
      scoring.score = attn::ScoreKind::kGaussian;
    } else if (score != "dot_product") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter 'score': '", score,
          "' is not one of dot_product, gaussian"));
    }
  }
  if (auto it = parameters.find("scale"); it != parameters.end()) {
    const std::optional<double> scale = ParseNumber(it->second.string_value());
    if (!scale.has_value() || !(*scale > 0) || !std::isfinite(*scale) ||
        !std::isfinite(static_cast<float>(*scale))) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter 'scale': '", it->second.string_value(),
          "' is not a finite positive number"));
    }
    scoring.scale = static_cast<float>(*scale);
  }
  return scoring;
}

absl::Status CheckAttentionMemory(const std::string& where,
                                  const RepositoryModel& model) {
  ASSIGN_OR_RETURN(const StoredTensor* keys,
                   RequiredTensor(where, model, "keys", 2, /*bfloat16_too=*/true));
  ASSIGN_OR_RETURN(
      const StoredTensor* values,
      RequiredTensor(where, model, "values", 2, /*bfloat16_too=*/true));
  if (keys->is_bfloat16() != values->is_bfloat16()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": keys and values must both be F32 or both BF16"));
  }
  if (keys->shape[0] != values->shape[0] || keys->shape[0] < 1 ||
      keys->shape[1] < 1 || values->shape[1] < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": keys ", attn::ShapeToString(keys->shape), " and values ",
        attn::ShapeToString(values->shape),
        " must be [N, d] and [N, v] with the same N, each at least 1"));
  }
  RETURN_IF_ERROR(CheckFinite(where, "keys", *keys, "a memory"));
  RETURN_IF_ERROR(CheckFinite(where, "values", *values, "a memory"));
  RETURN_IF_ERROR(CheckWithinMaxRows(where, model, "keys"));
  return ScoringOf(where, model).status();
}

// The shape rows extending `stored` must have: (n, <its dimensions after
// the first>).
std::string RowsShape(const attn::Shape& stored) {
  std::string shape = "(n";
  for (size_t i = 1; i < stored.size(); ++i) {
    absl::StrAppend(&shape, ", ", stored[i]);
  }
  return absl::StrCat(shape, stored.size() == 1 ? ",)" : ")");
}

// Checks that `rows`, sent as `field`, extend the stored tensor
// `stored_name` of model `name`: its rank and dimensions after the first,
// and n >= 1 rows. INVALID_ARGUMENT naming the field otherwise.
absl::Status CheckRowsOf(absl::string_view field, const attn::TensorView& rows,
                         const std::string& name,
                         const std::string& stored_name,
                         const StoredTensor& stored) {
  const bool fits = rows.shape.size() == stored.shape.size() &&
                    std::equal(rows.shape.begin() + 1, rows.shape.end(),
                               stored.shape.begin() + 1);
  if (fits && rows.shape[0] >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": shape ", attn::ShapeToString(rows.shape), " must be ",
      RowsShape(stored.shape), fits ? " with n >= 1 (an empty append)" : "",
      ": model '", name, "' holds ", stored_name, " ",
      attn::ShapeToString(stored.shape)));
}

// The rows `rows` (field `field`) add, in the stored type: a view of
// the call's values for F32 (used only while the append runs), or a copy
// rounded to bfloat16, where a value beyond bfloat16's range is refused.
absl::StatusOr<StoredTensor> RowsInTypeOf(absl::string_view field,
                                          const attn::TensorView& rows,
                                          bool bfloat16) {
  // The front ends check every element; a stored model must never hold a
  // NaN however its rows came.
  for (int64_t i = 0; i < rows.num_elements(); ++i) {
    if (!std::isfinite(rows.data[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": element ", i, " is ", rows.data[i],
          "; a stored model's rows must be finite"));
    }
  }
  if (!bfloat16) {
    return StoredTensor(rows.shape, rows.data, nullptr);
  }
  auto bits = std::make_shared<std::vector<uint16_t>>(rows.num_elements());
  for (size_t i = 0; i < bits->size(); ++i) {
    (*bits)[i] = attn::BFloat16Bits(rows.data[i]);
    if (!std::isfinite(attn::WidenBFloat16((*bits)[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": element ", i, " (", rows.data[i],
          ") is beyond bfloat16's range, which the memory stores"));
    }
  }
  const uint16_t* data = bits->data();
  return StoredTensor(rows.shape, data, std::move(bits));
}

// An append's rows, `keys` and `values` extending the stored tensors
// `key_rows` and `value_rows` of `model` (`name`), each of the rank and
// width it holds, in its type.
absl::StatusOr<ModelRepository::Rows> PrepareRows(
    const std::string& name, const RepositoryModel& model,
    const attn::TensorView& keys, const attn::TensorView& values,
    const char* key_rows, const char* value_rows) {
  ModelRepository::Rows rows;
  for (const auto& [field, stored_name, given] :
       {std::tuple<const char*, const char*, const attn::TensorView&>{
            "keys", key_rows, keys},
        {"values", value_rows, values}}) {
    const StoredTensor& stored = model.tensors.at(stored_name);
    RETURN_IF_ERROR(CheckRowsOf(field, given, name, stored_name, stored));
    ASSIGN_OR_RETURN(rows[stored_name],
                     RowsInTypeOf(field, given, stored.is_bfloat16()));
  }
  if (keys.shape[0] != values.shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values: shape ", attn::ShapeToString(values.shape), " must have ",
        keys.shape[0], " rows, as keys ", attn::ShapeToString(keys.shape)));
  }
  return rows;
}

// An append to a memory: keys (n, d) and values (n, v).
absl::StatusOr<ModelRepository::Rows> PrepareMemoryAppend(
    const std::string& name, const RepositoryModel& model,
    const attn::TensorView& keys, const attn::TensorView& values) {
  return PrepareRows(name, model, keys, values, "keys", "values");
}

// An append to a trained Nadaraya-Watson model's set: x as keys, y as
// values.
absl::StatusOr<ModelRepository::Rows> PrepareTrainingSetAppend(
    const std::string& name, const RepositoryModel& model,
    const attn::TensorView& keys, const attn::TensorView& values) {
  return PrepareRows(name, model, keys, values, "x_train", "y_train");
}

// The spec named `name` of `specs` (one the kind declares).
TensorSpec& SpecNamed(std::vector<TensorSpec>& specs, const std::string& name) {
  return *std::find_if(specs.begin(), specs.end(),
                       [&](const TensorSpec& spec) { return spec.name == name; });
}

// queries [B, Lq, q] and keys [B, Lk, k], the widths W_q [h, q] and
// W_k [h, k] take.
void AdditiveWeightsDimensions(const RepositoryModel& model,
                               ModelSignature* signature) {
  SpecNamed(signature->inputs, "queries").shape = {
      -1, -1, model.tensors.at("W_q").shape[1]};
  SpecNamed(signature->inputs, "keys").shape = {
      -1, -1, model.tensors.at("W_k").shape[1]};
}

// queries [B, Lq, d], output [B, Lq, v], attention_weights [B, Lq, N].
void AttentionMemoryDimensions(const RepositoryModel& memory,
                               ModelSignature* signature) {
  const attn::Shape& keys = memory.tensors.at("keys").shape;
  const attn::Shape& values = memory.tensors.at("values").shape;
  SpecNamed(signature->inputs, "queries").shape = {-1, -1, keys[1]};
  SpecNamed(signature->outputs, "output").shape = {-1, -1, values[1]};
  SpecNamed(signature->outputs, "attention_weights").shape = {-1, -1, keys[0]};
}

// x_query [m] or [m, dx] and y_pred [m] or [m, dy], as the stored set's
// ranks; attention_weights [m, N].
void TrainingSetDimensions(const RepositoryModel& model,
                           ModelSignature* signature) {
  const attn::Shape& x = model.tensors.at("x_train").shape;
  const attn::Shape& y = model.tensors.at("y_train").shape;
  auto rows_of = [](const attn::Shape& set) {
    return set.size() == 1 ? std::vector<int64_t>{-1}
                           : std::vector<int64_t>{-1, set[1]};
  };
  SpecNamed(signature->inputs, "x_query").shape = rows_of(x);
  SpecNamed(signature->outputs, "y_pred").shape = rows_of(y);
  SpecNamed(signature->outputs, "attention_weights").shape = {-1, x[0]};
}

// Every query of the call attends to the memory: the call's [B, Lq, d]
// queries are one batch entry of B * Lq rows (server/execution/operation.h,
// StoredRequest), and its result is seen as [B, Lq, v] (weights
// [B, Lq, N]). A memory stored as bfloat16 computes in bfloat16 (the
// library's rule), which a call asking for float32, the default, or
// bfloat16 gets; float16 is refused.
absl::StatusOr<OperationRequest> BuildAttentionMemory(
    const KindArguments& arguments) {
  const RepositoryModel& memory = *arguments.stored;
  const StoredTensor& keys = memory.tensors.at("keys");
  const StoredTensor& values = memory.tensors.at("values");
  const attn::TensorView queries = arguments.inputs.Float("queries");
  if (queries.shape.size() != 3 || queries.shape[2] != keys.shape[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "queries: shape ", attn::ShapeToString(queries.shape),
        " must be (B, Lq, ", keys.shape[1], "): model '", arguments.model_name,
        "' holds keys ", attn::ShapeToString(keys.shape)));
  }
  ASSIGN_OR_RETURN(const MemoryScoring scoring,
                   ScoringOf(arguments.model_name, memory));
  const int64_t batch = queries.shape[0], rows = queries.shape[1];
  attn::AttentionRequest attention;
  attention.queries = queries;
  attention.queries.shape = {1, batch * rows, queries.shape[2]};
  attention.keys = keys.view();
  attention.keys.shape = {1, keys.shape[0], keys.shape[1]};
  attention.values = values.view();
  attention.values.shape = {1, values.shape[0], values.shape[1]};
  attention.precision =
      arguments.precision.value_or(attn::Precision::kFloat32);
  if (keys.is_bfloat16()) {
    if (attention.precision == attn::Precision::kFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "precision: memory '", arguments.model_name,
          "' holds bfloat16 keys and values, so its calls compute in "
          "bfloat16 (precision float32, the default, or bfloat16), not "
          "float16"));
    }
    attention.keys_bfloat16 = keys.bfloat16;
    attention.values_bfloat16 = values.bfloat16;
    attention.precision = attn::Precision::kBFloat16;
  }
  attention.score = scoring.score;
  attention.scale = scoring.scale;
  attention.return_weights = arguments.return_weights;
  attention.held = memory.held_memory.get();
  StoredRequest stored{attention,
                       &memory,
                       memory.lineage.get(),
                       {batch, rows, values.shape[1]},
                       {batch, rows, keys.shape[0]}};
  // A grown memory held in pieces: one request per piece, merged when run.
  // (A device's copy is held per version, whose pieces are not one tensor:
  // pieces hold none, and run where the log-sum-exp is computed.)
  const absl::Span<const StoredTensor> key_parts = keys.parts();
  const absl::Span<const StoredTensor> value_parts = values.parts();
  if (key_parts.size() != value_parts.size()) {
    return absl::InternalError(absl::StrCat(
        "memory '", arguments.model_name, "': its keys are held in ",
        key_parts.size(), " pieces, its values in ", value_parts.size()));
  }
  if (key_parts.size() > 1) {
    for (size_t i = 0; i < key_parts.size(); ++i) {
      if (key_parts[i].shape[0] != value_parts[i].shape[0]) {
        return absl::InternalError(absl::StrCat(
            "memory '", arguments.model_name, "': piece ", i, " holds ",
            key_parts[i].shape[0], " keys and ", value_parts[i].shape[0],
            " values"));
      }
      attn::AttentionRequest piece = attention;
      piece.keys = key_parts[i].view();
      piece.keys.shape = {1, key_parts[i].shape[0], key_parts[i].shape[1]};
      piece.values = value_parts[i].view();
      piece.values.shape = {1, value_parts[i].shape[0],
                            value_parts[i].shape[1]};
      piece.keys_bfloat16 = key_parts[i].bfloat16;
      piece.values_bfloat16 = value_parts[i].bfloat16;
      piece.held = nullptr;
      stored.pieces.push_back(std::move(piece));
    }
    stored.request = stored.pieces.front();
  }
  return stored;
}

ModelKind* NewKind(ModelSignature signature, ModelKind::BuildRequest build,
                   std::string result_output, std::string weights_output) {
  auto* kind = new ModelKind;
  kind->signature = std::move(signature);
  kind->build_request = build;
  kind->result_output = std::move(result_output);
  kind->weights_output = std::move(weights_output);
  return kind;
}

const ModelKind& MaskedSoftmaxKind() {
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        {"masked_softmax",
         Operation::kMaskedSoftmax,
         {{"X", "FP32", {-1, -1, -1}}, {"valid_lens", "INT32", {-1}, true}},
         {{"Y", "FP32", {-1, -1, -1}}},
         {"Y"}},
        BuildMaskedSoftmax, "Y", "");
    kind->argument_inputs = {{"x:", "X"}};
    return kind;
  }();
  return *kind;
}

const ModelKind& BatchMatmulKind() {
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        {"batch_matmul",
         Operation::kBatchMatmul,
         {{"X", "FP32", {-1, -1, -1}}, {"Y", "FP32", {-1, -1, -1}}},
         {{"Z", "FP32", {-1, -1, -1}}},
         {"Z"}},
        BuildBatchMatmul, "Z", "");
    kind->argument_inputs = {{"a:", "X"}, {"b:", "Y"}};
    return kind;
  }();
  return *kind;
}

const ModelKind& DotProductAttentionKind() {
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        AttentionSignature("dot_product_attention",
                           Operation::kScaledDotProductAttention),
        BuildDotProductAttention, "output", "attention_weights");
    kind->config_batch_dimension = true;
    return kind;
  }();
  return *kind;
}

const ModelKind& NadarayaWatsonKind() {
  static const ModelKind* const kind =
      NewKind(NadarayaWatsonSignature(), BuildNadarayaWatson, "y_pred",
              "attention_weights");
  return *kind;
}

}  // namespace

const std::vector<const ModelKind*>& BuiltInModelKinds() {
  static const auto* const kinds = new std::vector<const ModelKind*>{
      &MaskedSoftmaxKind(), &BatchMatmulKind(), &DotProductAttentionKind(),
      &NadarayaWatsonKind()};
  return *kinds;
}

const ModelKind& AdditiveAttentionKind() {
  // The signature's name is a placeholder: every stored model has its own.
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        AttentionSignature("additive_attention", Operation::kAdditiveAttention),
        BuildAdditiveAttention, "output", "attention_weights");
    kind->backend = "additive_attention";
    kind->check_stored = CheckAdditiveAttention;
    kind->stored_dimensions = AdditiveWeightsDimensions;
    return kind;
  }();
  return *kind;
}

const ModelKind& FittedNadarayaWatsonKind() {
  static const ModelKind* const kind = [] {
    ModelKind* kind =
        NewKind(NadarayaWatsonSignature(), BuildFittedNadarayaWatson,
                "y_pred", "attention_weights");
    kind->backend = "nadaraya_watson";
    kind->check_stored = CheckNadarayaWatsonModel;
    return kind;
  }();
  return *kind;
}

const ModelKind& TrainedNadarayaWatsonKind() {
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        {"nadaraya_watson",
         Operation::kNadarayaWatson,
         {{"x_query", "FP32", {-1}}},
         {{"y_pred", "FP32", {-1}}, {"attention_weights", "FP32", {-1, -1}}},
         {"y_pred"}},
        BuildTrainedNadarayaWatson, "y_pred", "attention_weights");
    kind->backend = "nadaraya_watson";
    kind->check_stored = CheckNadarayaWatsonModel;
    kind->stored_dimensions = TrainingSetDimensions;
    kind->prepare_append = PrepareTrainingSetAppend;
    kind->row_tensors = {"x_train", "y_train"};
    // Not by default: one query over a stored set costs an exponential per
    // point, which stacking does not share. Measured single-query calls
    // over 1-D sets at 64 in flight, batching on / off: 0.85x at 65,536
    // points, 1.14x at 262,144, 1.37x at 1,048,576 (docs/batching.md).
    kind->gains_from_batching = false;
    return kind;
  }();
  return *kind;
}

const ModelKind& AttentionMemoryKind() {
  // The signature's name is a placeholder: every stored memory has its own.
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        {"attention_memory",
         Operation::kScaledDotProductAttention,
         {{"queries", "FP32", {-1, -1, -1}}},
         {{"output", "FP32", {-1, -1, -1}},
          {"attention_weights", "FP32", {-1, -1, -1}}},
         {"output"}},
        BuildAttentionMemory, "output", "attention_weights");
    kind->backend = "attention_memory";
    kind->check_stored = CheckAttentionMemory;
    kind->stored_dimensions = AttentionMemoryDimensions;
    kind->prepare_append = PrepareMemoryAppend;
    kind->row_tensors = {"keys", "values"};
    kind->reads_pieces = true;
    kind->argument_inputs = {{"queries:", "queries"}};
    kind->gains_from_batching = true;
    return kind;
  }();
  return *kind;
}

const ModelKind* KindOfStored(const RepositoryModel& model) {
  const ModelKind* kind = KindOfBackend(model.config.backend());
  if (kind == &FittedNadarayaWatsonKind() && HoldsTrainingSet(model)) {
    return &TrainedNadarayaWatsonKind();
  }
  return kind;
}

const ModelKind* KindOfBackend(absl::string_view backend) {
  for (const ModelKind* kind :
       {&AdditiveAttentionKind(), &FittedNadarayaWatsonKind(),
        &AttentionMemoryKind()}) {
    if (kind->backend == backend) return kind;
  }
  return nullptr;
}

absl::Status CheckStoredModel(const std::string& where,
                              const RepositoryModel& model) {
  const ModelKind* kind = KindOfBackend(model.config.backend());
  if (kind == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": backend '", model.config.backend(),
        "' is not one of additive_attention, nadaraya_watson, "
        "attention_memory"));
  }
  return kind->check_stored(where, model);
}

bool ReadsPieces(const RepositoryModel& model) {
  const ModelKind* kind = KindOfStored(model);
  return kind != nullptr && kind->reads_pieces;
}

absl::StatusOr<RepositoryModel> NewAttentionMemory(
    const std::string& name, const MemorySettings& settings,
    const attn::TensorView& keys, const attn::TensorView& values) {
  for (const auto& [field, given] :
       {std::pair<const char*, const attn::TensorView&>{"keys", keys},
        {"values", values}}) {
    if (given.rank() != 2 || given.shape[0] < 1 || given.shape[1] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": shape ", attn::ShapeToString(given.shape),
          " must be (n, ", field[0] == 'k' ? "d" : "v",
          ") with n, ", field[0] == 'k' ? "d" : "v",
          " >= 1 to make memory '", name, "'"));
    }
  }
  if (keys.shape[0] != values.shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values: shape ", attn::ShapeToString(values.shape), " must have ",
        keys.shape[0], " rows, as keys ", attn::ShapeToString(keys.shape)));
  }
  if (settings.scale.has_value() &&
      !(*settings.scale > 0 && std::isfinite(*settings.scale))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "create.scale: ", *settings.scale, " is not a finite positive number"));
  }
  if (settings.max_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "create.max_rows: ", settings.max_rows,
        " is negative (0: no window)"));
  }
  RepositoryModel model;
  model.config.set_name(name);
  model.config.set_platform("attnserve");
  model.config.set_backend(AttentionMemoryKind().backend);
  // Only what differs from the defaults, as a config written by hand.
  auto& parameters = *model.config.mutable_parameters();
  if (settings.score == attn::ScoreKind::kGaussian) {
    parameters["score"].set_string_value("gaussian");
  }
  if (settings.scale.has_value()) {
    // Shortest text that reads back as the same float.
    parameters["scale"].set_string_value(absl::StrCat(*settings.scale));
    if (ParseNumber(parameters["scale"].string_value()).value_or(0) !=
        static_cast<double>(*settings.scale)) {
      parameters["scale"].set_string_value(
          absl::StrFormat("%.9g", *settings.scale));
    }
  }
  // The window keeps the newest rows: the last max_rows of these.
  int64_t skipped = 0;
  if (settings.max_rows > 0) {
    parameters["max_rows"].set_string_value(absl::StrCat(settings.max_rows));
    skipped = std::max<int64_t>(0, keys.shape[0] - settings.max_rows);
  }
  for (const auto& [field, given] :
       {std::pair<const char*, const attn::TensorView&>{"keys", keys},
        {"values", values}}) {
    attn::TensorView kept = given;
    kept.shape[0] -= skipped;
    kept.data += skipped * given.shape[1];
    if (settings.bfloat16) {
      // Rounded as an append to a bfloat16 memory rounds.
      ASSIGN_OR_RETURN(model.tensors[field],
                       RowsInTypeOf(field, kept, /*bfloat16=*/true));
    } else {
      attn::Tensor copy = attn::Tensor::Zeros(kept.shape);
      std::copy(kept.data, kept.data + copy.data.size(), copy.data.begin());
      model.tensors[field] = std::move(copy);
    }
  }
  return model;
}

absl::Status CheckMemorySettings(absl::string_view field,
                                 const std::string& name,
                                 const RepositoryModel& model,
                                 const MemorySettings& settings) {
  if (model.config.backend() != AttentionMemoryKind().backend) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": model '", name, "' is a ", model.config.backend(),
        " model, not an attention memory"));
  }
  ASSIGN_OR_RETURN(const MemoryScoring scoring, ScoringOf(name, model));
  ASSIGN_OR_RETURN(const int64_t max_rows, MaxRowsOf(name, model));
  const MemorySettings held{scoring.score, scoring.scale,
                            model.tensors.at("keys").is_bfloat16(), max_rows};
  if (held.score == settings.score && held.scale == settings.scale &&
      held.bfloat16 == settings.bfloat16 && held.max_rows == settings.max_rows) {
    return absl::OkStatus();
  }
  auto describe = [](const MemorySettings& memory) {
    return absl::StrCat(
        "score ",
        memory.score == attn::ScoreKind::kGaussian ? "gaussian" : "dot_product",
        ", scale ",
        memory.scale.has_value() ? absl::StrCat(*memory.scale) : "default",
        ", ", memory.bfloat16 ? "bfloat16" : "float32", ", max_rows ",
        memory.max_rows > 0 ? absl::StrCat(memory.max_rows) : "none");
  };
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": memory '", name, "' exists with ", describe(held), ", not ",
      describe(settings), "; leave create unset to append to it"));
}

RepositoryModel FittedNadarayaWatsonModel(const std::string& name,
                                          float bandwidth) {
  RepositoryModel model;
  model.config.set_name(name);
  model.config.set_platform("attnserve");
  model.config.set_backend(FittedNadarayaWatsonKind().backend);
  attn::Tensor w = attn::Tensor::Zeros({1});
  w.data[0] = bandwidth;
  model.tensors["bandwidth"] = std::move(w);
  return model;
}

RepositoryModel TrainedNadarayaWatsonModel(const std::string& name,
                                           float bandwidth,
                                           attn::TensorView x_train,
                                           attn::TensorView y_train) {
  RepositoryModel model = FittedNadarayaWatsonModel(name, bandwidth);
  (*model.config.mutable_parameters())["kernel"].set_string_value(
      attn::RegressionKernelName(attn::RegressionKernel::kGaussian));
  for (const auto& [tensor_name, view] :
       {std::pair<const char*, attn::TensorView>{"x_train", x_train},
        {"y_train", y_train}}) {
    attn::Tensor tensor = attn::Tensor::Zeros(view.shape);
    std::copy(view.data, view.data + tensor.data.size(), tensor.data.begin());
    model.tensors[tensor_name] = std::move(tensor);
  }
  return model;
}

}  // namespace attnserve
