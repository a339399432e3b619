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
  };
  return std::visit(Visitor{}, request);
}

}  // namespace attnserve
