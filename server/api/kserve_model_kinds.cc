#include "server/api/kserve_model_kinds.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"
#include "server/api/kserve_parameters.h"

namespace attnserve {
namespace {

// The tensors of the attention models, built in and additive alike.
KServeModelSpec AttentionSpec(const std::string& name, Rpc rpc) {
  return {name,
          rpc,
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

absl::StatusOr<BatchableRequest> BuildMaskedSoftmax(
    const KindArguments& arguments) {
  attn::MaskedSoftmaxRequest op;
  op.x = arguments.inputs.Float("X");
  op.valid_lens = arguments.inputs.Lengths("valid_lens");
  return op;
}

absl::StatusOr<BatchableRequest> BuildBatchMatmul(
    const KindArguments& arguments) {
  attn::BatchMatmulRequest op;
  op.a = arguments.inputs.Float("X");
  op.b = arguments.inputs.Float("Y");
  return op;
}

absl::StatusOr<BatchableRequest> BuildDotProductAttention(
    const KindArguments& arguments) {
  attn::AttentionRequest op;
  op.queries = arguments.inputs.Float("queries");
  op.keys = arguments.inputs.Float("keys");
  op.values = arguments.inputs.Float("values");
  op.valid_lens = arguments.inputs.Lengths("valid_lens");
  op.return_weights = arguments.return_weights;
  return op;
}

// The weights are the repository model's (checked when it was loaded).
absl::StatusOr<BatchableRequest> BuildAdditiveAttention(
    const KindArguments& arguments) {
  const auto& weights = arguments.repository_model->tensors;
  attn::AdditiveAttentionRequest op;
  op.queries = arguments.inputs.Float("queries");
  op.keys = arguments.inputs.Float("keys");
  op.values = arguments.inputs.Float("values");
  op.valid_lens = arguments.inputs.Lengths("valid_lens");
  op.w_q = weights.at("W_q").view();
  op.w_k = weights.at("W_k").view();
  op.w_v = weights.at("w_v").view();
  op.return_weights = arguments.return_weights;
  return op;
}

// The inputs and kernel of either Nadaraya-Watson model; the bandwidth is
// the caller's to set.
absl::StatusOr<attn::NadarayaWatsonRequest> NadarayaWatsonInputs(
    const KindArguments& arguments) {
  attn::NadarayaWatsonRequest op;
  op.x_train = arguments.inputs.Float("x_train");
  op.y_train = arguments.inputs.Float("y_train");
  op.x_query = arguments.inputs.Float("x_query");
  ASSIGN_OR_RETURN(op.kernel, KernelParameter(arguments.request));
  op.return_weights = arguments.return_weights;
  return op;
}

absl::StatusOr<BatchableRequest> BuildNadarayaWatson(
    const KindArguments& arguments) {
  ASSIGN_OR_RETURN(attn::NadarayaWatsonRequest op,
                   NadarayaWatsonInputs(arguments));
  ASSIGN_OR_RETURN(op.bandwidth, BandwidthParameter(arguments.request));
  return op;
}

// A fitted model serves its own bandwidth: a caller's would silently
// replace what was fitted, so one given is refused.
absl::StatusOr<BatchableRequest> BuildFittedNadarayaWatson(
    const KindArguments& arguments) {
  ASSIGN_OR_RETURN(attn::NadarayaWatsonRequest op,
                   NadarayaWatsonInputs(arguments));
  if (arguments.request.parameters().count("bandwidth")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter 'bandwidth': model '", arguments.model_name,
        "' serves its fitted bandwidth"));
  }
  op.bandwidth = arguments.repository_model->tensors.at("bandwidth").data[0];
  return op;
}

ModelKind* NewKind(KServeModelSpec spec, ModelKind::BuildRequest build_request,
                   std::string result_output, std::string weights_output) {
  auto* kind = new ModelKind;
  kind->spec = std::move(spec);
  kind->build_request = build_request;
  kind->result_output = std::move(result_output);
  kind->weights_output = std::move(weights_output);
  return kind;
}

const ModelKind& MaskedSoftmaxKind() {
  static const ModelKind* const kind = [] {
    ModelKind* kind = NewKind(
        {"masked_softmax",
         Rpc::kMaskedSoftmax,
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
         Rpc::kBatchMatmul,
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
        AttentionSpec("dot_product_attention", Rpc::kScaledDotProductAttention),
        BuildDotProductAttention, "output", "attention_weights");
    kind->config_batch_dimension = true;
    return kind;
  }();
  return *kind;
}

KServeModelSpec NadarayaWatsonSpec() {
  return {"nadaraya_watson",
          Rpc::kNadarayaWatson,
          {{"x_train", "FP32", {-1}},
           {"y_train", "FP32", {-1}},
           {"x_query", "FP32", {-1}}},
          {{"y_pred", "FP32", {-1}}, {"attention_weights", "FP32", {-1, -1}}},
          {"y_pred"}};
}

const ModelKind& NadarayaWatsonKind() {
  static const ModelKind* const kind =
      NewKind(NadarayaWatsonSpec(), BuildNadarayaWatson, "y_pred",
              "attention_weights");
  return *kind;
}

}  // namespace

std::map<std::string, const attn::Tensor*> ModelKind::ResultTensors(
    const attn::OpResult& result) const {
  std::map<std::string, const attn::Tensor*> tensors{
      {result_output, &result.output}};
  if (!weights_output.empty()) tensors[weights_output] = &result.weights;
  return tensors;
}

absl::Status ModelKind::WithInputNames(absl::Status status) const {
  if (status.ok()) return status;
  for (const auto& [prefix, input] : argument_inputs) {
    if (absl::StartsWith(status.message(), prefix)) {
      return absl::Status(
          status.code(),
          absl::StrCat("input '", input, "'",
                       status.message().substr(prefix.size() - 1)));
    }
  }
  return status;
}

const std::vector<const ModelKind*>& BuiltInModelKinds() {
  static const auto* const kinds = new std::vector<const ModelKind*>{
      &MaskedSoftmaxKind(), &BatchMatmulKind(), &DotProductAttentionKind(),
      &NadarayaWatsonKind()};
  return *kinds;
}

const ModelKind& AdditiveAttentionKind() {
  // The spec's name is a placeholder: every additive model has its own.
  static const ModelKind* const kind =
      NewKind(AttentionSpec("additive_attention", Rpc::kAdditiveAttention),
              BuildAdditiveAttention, "output", "attention_weights");
  return *kind;
}

const ModelKind& FittedNadarayaWatsonKind() {
  static const ModelKind* const kind =
      NewKind(NadarayaWatsonSpec(), BuildFittedNadarayaWatson, "y_pred",
              "attention_weights");
  return *kind;
}

}  // namespace attnserve
