#include "client/load_rpc.h"

#include "gtest/gtest.h"

namespace attnctl {
namespace {

// ParseLoadRpc and LoadRpcName are tested through client/load.h in
// load_test.cc; this covers the method names the calls are sent to.
TEST(LoadRpcMethodTest, FullMethodNames) {
  EXPECT_EQ(LoadRpcMethod(LoadRpc::kScaledDotProductAttention),
            "/attention.v1.AttentionService/ScaledDotProductAttention");
  EXPECT_EQ(LoadRpcMethod(LoadRpc::kBatchMatmul),
            "/attention.v1.AttentionService/BatchMatmul");
  EXPECT_EQ(LoadRpcMethod(LoadRpc::kFitBandwidth),
            "/attention.v1.AttentionService/FitBandwidth");
  EXPECT_EQ(LoadRpcMethod(LoadRpc::kHealth), "/grpc.health.v1.Health/Check");
}

TEST(LoadRpcMethodTest, EveryRpcHasOne) {
  for (LoadRpc rpc :
       {LoadRpc::kScaledDotProductAttention, LoadRpc::kMaskedSoftmax,
        LoadRpc::kBatchMatmul, LoadRpc::kAdditiveAttention,
        LoadRpc::kNadarayaWatson, LoadRpc::kFitBandwidth,
        LoadRpc::kAppendMemory, LoadRpc::kHealth}) {
    EXPECT_FALSE(LoadRpcMethod(rpc).empty()) << LoadRpcName(rpc);
  }
}

}  // namespace
}  // namespace attnctl
