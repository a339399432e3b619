// The RPCs `attnctl load` can drive: their attnctl names (--rpc) and the
// full gRPC method names the load generator calls them by.
//
// Thread-safe: pure functions over a constant table; none blocks.
#ifndef ATTNSERVE_CLIENT_LOAD_RPC_H_
#define ATTNSERVE_CLIENT_LOAD_RPC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnctl {

enum class LoadRpc {
  kScaledDotProductAttention,
  kMaskedSoftmax,
  kBatchMatmul,
  kAdditiveAttention,
  kNadarayaWatson,
  kFitBandwidth,
  kAppendMemory,  // a stored memory grows: one append per call
  kHealth,  // grpc.health.v1.Health/Check: the per-call overhead baseline
};

// "attention" | "masked-softmax" | "batch-matmul" | "additive-attention" |
// "nadaraya-watson" | "fit-bandwidth" | "append" | "health" (the attnctl
// subcommand
// names). INVALID_ARGUMENT otherwise.
absl::StatusOr<LoadRpc> ParseLoadRpc(absl::string_view text);
absl::string_view LoadRpcName(LoadRpc rpc);

// The full method name a call goes to, like
// "/attention.v1.AttentionService/BatchMatmul" or
// "/grpc.health.v1.Health/Check"; empty for a value outside the enum.
std::string LoadRpcMethod(LoadRpc rpc);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_RPC_H_
