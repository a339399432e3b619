#include "server/core/rpc.h"

namespace attnserve {

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kMaskedSoftmax:
      return "MaskedSoftmax";
    case Rpc::kBatchMatmul:
      return "BatchMatmul";
    case Rpc::kScaledDotProductAttention:
      return "ScaledDotProductAttention";
    case Rpc::kAdditiveAttention:
      return "AdditiveAttention";
    case Rpc::kNadarayaWatson:
      return "NadarayaWatson";
    case Rpc::kFitBandwidth:
      return "FitBandwidth";
  }
  return "unknown";
}

}  // namespace attnserve
