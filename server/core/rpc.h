// The operations the server serves, one value per RPC of the typed API
// (attention.v1.AttentionService); each KServe model kind maps onto one
// (server/api/kserve_model_kinds.h). Their names (RpcName) are the typed
// API's method names, and the `rpc` label of every metric.
//
// One name per operation through the layers; where a name differs, the wire
// or the command line fixed it before this rule:
//   RPC and metrics label   library (attn::Engine)      KServe model
//   MaskedSoftmax           MaskedSoftmax               masked_softmax
//   BatchMatmul             BatchMatmul                 batch_matmul
//   ScaledDotProductAttention ScaledDotProductAttention dot_product_attention
//   AdditiveAttention       AdditiveAttention           (repository models)
//   NadarayaWatson          NadarayaWatson              nadaraya_watson
//   FitBandwidth            FitBandwidth                (save_as writes one)
// The Python client's methods are these names in snake_case; attnctl's
// subcommands and the load generator's --rpc in kebab-case, except
// ScaledDotProductAttention's, `attention`. The request messages keep the
// proto's names (attention.v1.AttentionRequest, attn::AttentionRequest: its
// score may also be Gaussian).
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

// The protocol a call came by: the `protocol` label of the request metrics.
enum class Protocol { kGrpc, kHttp };
inline constexpr int kProtocolCount = 2;
inline const char* ProtocolName(Protocol protocol) {
  return protocol == Protocol::kHttp ? "http" : "grpc";
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_CORE_RPC_H_
