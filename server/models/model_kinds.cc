#include "server/models/model_kinds.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attnserve {
namespace {

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
absl::StatusOr<const attn::Tensor*> StoredTensor(const std::string& where,
                                                 const RepositoryModel& model,
                                                 const std::string& name,
                                                 size_t rank) {
  auto it = model.tensors.find(name);
  if (it == model.tensors.end() || it->second.shape.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": backend ", model.config.backend(), " needs a rank-", rank,
        " tensor '", name, "' in weights.safetensors"));
  }
  return &it->second;
}

absl::Status CheckAdditiveAttention(const std::string& where,
                                    const RepositoryModel& model) {
  ASSIGN_OR_RETURN(const attn::Tensor* w_q,
                   StoredTensor(where, model, "W_q", 2));
  ASSIGN_OR_RETURN(const attn::Tensor* w_k,
                   StoredTensor(where, model, "W_k", 2));
  ASSIGN_OR_RETURN(const attn::Tensor* w_v,
                   StoredTensor(where, model, "w_v", 1));
  if (w_k->shape[0] != w_q->shape[0] || w_v->shape[0] != w_q->shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": W_q ", attn::ShapeToString(w_q->shape), ", W_k ",
        attn::ShapeToString(w_k->shape), " and w_v ",
        attn::ShapeToString(w_v->shape),
        " must share their first dimension h"));
  }
  return absl::OkStatus();
}

absl::Status CheckFittedNadarayaWatson(const std::string& where,
                                       const RepositoryModel& model) {
  ASSIGN_OR_RETURN(const attn::Tensor* w,
                   StoredTensor(where, model, "bandwidth", 1));
  if (w->data.size() != 1 || !(w->data[0] > 0) || !std::isfinite(w->data[0])) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": bandwidth must hold one finite positive value"));
  }
  return absl::OkStatus();
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

// The inputs and kernel of either Nadaraya-Watson kind; the bandwidth is
// the caller's to set.
absl::StatusOr<attn::NadarayaWatsonRequest> NadarayaWatsonInputs(
    const KindArguments& arguments) {
  attn::NadarayaWatsonRequest op;
  op.x_train = arguments.inputs.Float("x_train");
  op.y_train = arguments.inputs.Float("y_train");
  op.x_query = arguments.inputs.Float("x_query");
  ASSIGN_OR_RETURN(op.kernel, KernelParameter(arguments.parameters));
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
    kind->check_stored = CheckFittedNadarayaWatson;
    return kind;
  }();
  return *kind;
}

const ModelKind* KindOfBackend(absl::string_view backend) {
  for (const ModelKind* kind :
       {&AdditiveAttentionKind(), &FittedNadarayaWatsonKind()}) {
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
        "' is not one of additive_attention, nadaraya_watson"));
  }
  return kind->check_stored(where, model);
}

void BindAdditiveWeights(const RepositoryModel& model,
                         attn::AdditiveAttentionRequest* op) {
  op->w_q = model.tensors.at("W_q").view();
  op->w_k = model.tensors.at("W_k").view();
  op->w_v = model.tensors.at("w_v").view();
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

}  // namespace attnserve
