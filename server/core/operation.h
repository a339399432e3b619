// The operations the server serves, one value per RPC of the typed API
// (attention.v1.AttentionService), and the request of each: what a call
// becomes once a front end has decoded it, whichever front end it came by.
// Each model kind runs one operation (server/models/model_kinds.h). Their
// names (OperationName) are the typed API's method names, and the `rpc`
// label of every metric (a name the metrics kept from before this rule).
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
#ifndef ATTNSERVE_SERVER_CORE_OPERATION_H_
#define ATTNSERVE_SERVER_CORE_OPERATION_H_

#include <variant>

#include "attn/ops.h"

namespace attnserve {

enum class Operation {
  kMaskedSoftmax,
  kBatchMatmul,
  kScaledDotProductAttention,
  kAdditiveAttention,
  kNadarayaWatson,
  kFitBandwidth,
};
inline constexpr int kOperationCount = 6;

// The operation's name, e.g. "ScaledDotProductAttention". Thread-safe.
const char* OperationName(Operation operation);

// One request of any operation the serving core runs, batched or alone
// (FitBandwidth, which is never batched, runs as a call's own work). Its
// views must stay valid until it has run.
using OperationRequest =
    std::variant<attn::MaskedSoftmaxRequest, attn::BatchMatmulRequest,
                 attn::AttentionRequest, attn::AdditiveAttentionRequest,
                 attn::NadarayaWatsonRequest>;

// The request's operation, for metrics.
Operation OperationOf(const OperationRequest& request);

// The protocol a call came by: the `protocol` label of the request metrics.
enum class Protocol { kGrpc, kHttp };
inline constexpr int kProtocolCount = 2;
inline const char* ProtocolName(Protocol protocol) {
  return protocol == Protocol::kHttp ? "http" : "grpc";
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_CORE_OPERATION_H_
