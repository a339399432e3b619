#include "server/core/operation.h"

#include <variant>

namespace attnserve {

const char* OperationName(Operation operation) {
  switch (operation) {
    case Operation::kMaskedSoftmax:
      return "MaskedSoftmax";
    case Operation::kBatchMatmul:
      return "BatchMatmul";
    case Operation::kScaledDotProductAttention:
      return "ScaledDotProductAttention";
    case Operation::kAdditiveAttention:
      return "AdditiveAttention";
    case Operation::kNadarayaWatson:
      return "NadarayaWatson";
    case Operation::kFitBandwidth:
      return "FitBandwidth";
  }
  return "unknown";
}

Operation OperationOf(const OperationRequest& request) {
  struct Visitor {
    Operation operator()(const attn::MaskedSoftmaxRequest&) { return Operation::kMaskedSoftmax; }
    Operation operator()(const attn::BatchMatmulRequest&) { return Operation::kBatchMatmul; }
    Operation operator()(const attn::AttentionRequest&) {
      return Operation::kScaledDotProductAttention;
    }
    Operation operator()(const attn::AdditiveAttentionRequest&) {
      return Operation::kAdditiveAttention;
    }
    Operation operator()(const attn::NadarayaWatsonRequest&) {
      return Operation::kNadarayaWatson;
    }
    Operation operator()(const MemoryAttentionRequest&) {
      return Operation::kScaledDotProductAttention;
    }
    Operation operator()(const StoredRegressionRequest&) {
      return Operation::kNadarayaWatson;
    }
  };
  return std::visit(Visitor{}, request);
}

namespace {

absl::StatusOr<attn::ResultSize> SizeOf(const MemoryAttentionRequest& r) {
  absl::StatusOr<attn::ResultSize> size = attn::SizeOfResult(r.attention);
  if (size.ok()) {
    size->output_shape = {r.batch, r.queries, size->output_shape.back()};
    if (!size->weights_shape.empty()) {
      size->weights_shape = {r.batch, r.queries, size->weights_shape.back()};
    }
  }
  return size;
}

absl::StatusOr<attn::ResultSize> SizeOf(const StoredRegressionRequest& r) {
  return attn::SizeOfResult(r.regression);
}

template <typename Request>
absl::StatusOr<attn::ResultSize> SizeOf(const Request& r) {
  return attn::SizeOfResult(r);
}

}  // namespace

absl::StatusOr<attn::ResultSize> ResultSizeOf(const OperationRequest& request) {
  return std::visit([](const auto& r) { return SizeOf(r); }, request);
}

}  // namespace attnserve
