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

#include <cstdint>
#include <variant>

#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "attn/validate.h"

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

// Scaled dot-product attention against a memory a model holds
// (server/models/model_kinds.h, backend attention_memory): every query of
// the call, all of its B x Lq, attends to the same N keys and values, so
// `attention` is one batch entry: queries [1, B * Lq, d], keys [1, N, d],
// values [1, N, v]; the result is reshaped to the call's [B, Lq, v] (and
// weights [B, Lq, N]). `memory` identifies the stored version the views
// point into: requests with the same identity share their keys and values,
// so the batcher stacks their queries into one pass over the memory.
struct MemoryAttentionRequest {
  attn::AttentionRequest attention;
  const void* memory = nullptr;
  int64_t batch = 1;    // B
  int64_t queries = 0;  // Lq
};

// Nadaraya-Watson regression over a training set a model holds
// (server/models/model_kinds.h, backend nadaraya_watson with x_train and
// y_train): `regression` points into the stored version that `training_set`
// identifies. Requests with the same identity share their keys and values,
// so the batcher concatenates their queries without reading the set to
// compare it.
struct StoredRegressionRequest {
  attn::NadarayaWatsonRequest regression;
  const void* training_set = nullptr;
};

// One request of any operation the execution stack runs, batched or alone
// (FitBandwidth, which is never batched, runs as a call's own work). Its
// views must stay valid until it has run.
using OperationRequest =
    std::variant<attn::MaskedSoftmaxRequest, attn::BatchMatmulRequest,
                 attn::AttentionRequest, attn::AdditiveAttentionRequest,
                 attn::NadarayaWatsonRequest, MemoryAttentionRequest,
                 StoredRegressionRequest>;

// The request's operation, for metrics.
Operation OperationOf(const OperationRequest& request);

// The shape and size of the request's result, or the library's
// INVALID_ARGUMENT for a request it refuses (attn::SizeOfResult).
absl::StatusOr<attn::ResultSize> ResultSizeOf(const OperationRequest& request);

// The protocol a call came by: the `protocol` label of the request metrics.
enum class Protocol { kGrpc, kHttp };
inline constexpr int kProtocolCount = 2;
inline const char* ProtocolName(Protocol protocol) {
  return protocol == Protocol::kHttp ? "http" : "grpc";
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_CORE_OPERATION_H_
