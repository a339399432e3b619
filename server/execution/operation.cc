#include "server/execution/operation.h"

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
    Operation operator()(const attn::MaskedSoftmaxRequest&) {
      return Operation::kMaskedSoftmax;
    }
    Operation operator()(const attn::BatchMatmulRequest&) {
      return Operation::kBatchMatmul;
    }
    Operation operator()(const attn::AttentionRequest&) {
      return Operation::kScaledDotProductAttention;
    }
    Operation operator()(const attn::AdditiveAttentionRequest&) {
      return Operation::kAdditiveAttention;
    }
    Operation operator()(const attn::NadarayaWatsonRequest&) {
      return Operation::kNadarayaWatson;
    }
    Operation operator()(const StoredRequest& r) {
      return std::visit(*this, r.request);
    }
  };
  return std::visit(Visitor{}, request);
}

namespace {

// A request's result size; a stored version's in the call's own shapes.
struct ResultSizeVisitor {
  template <typename Request>
  absl::StatusOr<attn::ResultSize> operator()(const Request& r) const {
    return attn::SizeOfResult(r);
  }
  absl::StatusOr<attn::ResultSize> operator()(const StoredRequest& r) const {
    absl::StatusOr<attn::ResultSize> size = std::visit(*this, r.request);
    if (size.ok()) {
      size->output_shape = r.output_shape;
      if (!size->weights_shape.empty()) size->weights_shape = r.weights_shape;
    }
    return size;
  }
};

}  // namespace

absl::StatusOr<attn::ResultSize> ResultSizeOf(const OperationRequest& request) {
  return std::visit(ResultSizeVisitor{}, request);
}

}  // namespace attnserve
