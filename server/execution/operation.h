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
#ifndef ATTNSERVE_SERVER_EXECUTION_OPERATION_H_
#define ATTNSERVE_SERVER_EXECUTION_OPERATION_H_

#include <cstdint>
#include <variant>
#include <vector>

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

// A call whose large operands a stored version holds. A model kind
// (server/models/) builds `request` with its views pointing into the version
// `version` identifies and at the call's own query rows, one row of output
// (and of weights) per query row:
// - attention: queries [1, rows, d] against keys [1, N, d], values [1, N, v];
// - regression: x_query [rows] or [rows, dx] against x_train and y_train.
// Calls on the same version share everything but their rows, so a batch
// stacks the rows and reads the version once; it is keyed by identity and
// never hashed or compared (a version may hold gigabytes). The call sees its
// result in the shapes the kind gives: `output_shape`, and `weights_shape`
// when weights are returned, each the same elements as the rows computed.
struct StoredRequest {
  std::variant<attn::AttentionRequest, attn::NadarayaWatsonRequest> request;
  const void* version = nullptr;
  // The version's lineage, when it has one: versions of a memory that grew
  // by appends alone, each holding the rows of the one before in the same
  // places and more after them. A batch of attention over one lineage
  // reads its newest member's keys and masks each call's rows to its own
  // version's keys, so appends do not split batches. Null: by version.
  const void* lineage = nullptr;
  attn::Shape output_shape;
  attn::Shape weights_shape;
  // Attention over a memory held in pieces (a grown memory: its base file's
  // rows, then those appended since): one request per piece, in row order,
  // each `request` but for that piece's keys and values; `request` is the
  // first of them. Their answers merge exactly into the whole memory's
  // (attn/pieces.h). Empty: `request` is the whole call.
  std::vector<attn::AttentionRequest> pieces = {};
};

// One request of any operation the execution stack runs, batched or alone
// (FitBandwidth, which is never batched, runs as a call's own work). Its
// views must stay valid until it has run.
using OperationRequest =
    std::variant<attn::MaskedSoftmaxRequest, attn::BatchMatmulRequest,
                 attn::AttentionRequest, attn::AdditiveAttentionRequest,
                 attn::NadarayaWatsonRequest, StoredRequest>;

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

#endif  // ATTNSERVE_SERVER_EXECUTION_OPERATION_H_
