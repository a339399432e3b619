#include "client/load_rpc.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "attention/v1/attention.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace attnctl {
namespace {

struct RpcName {
  LoadRpc rpc;
  absl::string_view name;    // the attnctl subcommand
  // In attention.v1.AttentionService (grpc.health.v1.Health for kHealth).
  absl::string_view method;
};

constexpr RpcName kRpcNames[] = {
    {LoadRpc::kScaledDotProductAttention, "attention",
     "ScaledDotProductAttention"},
    {LoadRpc::kMaskedSoftmax, "masked-softmax", "MaskedSoftmax"},
    {LoadRpc::kBatchMatmul, "batch-matmul", "BatchMatmul"},
    {LoadRpc::kAdditiveAttention, "additive-attention", "AdditiveAttention"},
    {LoadRpc::kNadarayaWatson, "nadaraya-watson", "NadarayaWatson"},
    {LoadRpc::kFitBandwidth, "fit-bandwidth", "FitBandwidth"},
    {LoadRpc::kAppendMemory, "append", "AppendMemory"},
    {LoadRpc::kHealth, "health", "Check"},
};

}  // namespace

absl::StatusOr<LoadRpc> ParseLoadRpc(absl::string_view text) {
  std::vector<absl::string_view> names;
  for (const RpcName& entry : kRpcNames) {
    if (entry.name == text) return entry.rpc;
    names.push_back(entry.name);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "expected one of %s, got '%s'", absl::StrJoin(names, ", "), text));
}

absl::string_view LoadRpcName(LoadRpc rpc) {
  for (const RpcName& entry : kRpcNames) {
    if (entry.rpc == rpc) return entry.name;
  }
  return "";
}

std::string LoadRpcMethod(LoadRpc rpc) {
  for (const RpcName& entry : kRpcNames) {
    if (entry.rpc != rpc) continue;
    if (rpc == LoadRpc::kHealth) {
      return absl::StrCat("/", grpc::health::v1::Health::service_full_name(),
                          "/", entry.method);
    }
    return absl::StrCat("/", attention::v1::AttentionService::service_full_name(),
                        "/", entry.method);
  }
  return "";
}

}  // namespace attnctl
