// The operations the server serves, one value per RPC of the typed API
// (attention.v1.AttentionService); each KServe model kind maps onto one
// (server/api/kserve_model_kinds.h). Their names (RpcName) are the typed
// API's method names, and the `rpc` label of every metric.
#ifndef ATTNSERVE_SERVER_CORE_RPC_H_
#define ATTNSERVE_SERVER_CORE_RPC_H_

namespace attnserve {

enum class Rpc {
  kMaskedSoftmax,
  kBatchMatmul,
  kScaledDotProductAttention,
  kAdditiveAttention,
  kNadarayaWatson,
  kFitBandwidth,
};
inline constexpr int kRpcCount = 6;

// The RPC's method name, e.g. "ScaledDotProductAttention". Thread-safe.
const char* RpcName(Rpc rpc);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_CORE_RPC_H_
