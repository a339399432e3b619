// The CPU backend's implementation lists: the names in list order, and each
// implementation chosen where its takes() says, on every instruction set
// this CPU has (the lane kernel on AVX2 and AVX-512, the blocked kernels on
// baseline x86-64, whichever cap chose the copy), each result within the
// derived bounds of the double reference's. Also run under the isa_avx2
// and isa_baseline CTest variants, whose caps the expectations follow.
#include "attn/onednn_backend.h"

#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/cpu_isa.h"
#include "attn/engine.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AttentionBounds;
using ::attn::testing::RandomNormal;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::ViewOf;
using ::attn::testing::WithinBounds;

TEST(OneDnnBackendTest, ListsEveryImplementationInOrder) {
  auto backend = OneDnnBackend::Create(OneDnnBackend::Options{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->implementation_names(),
            (std::vector<std::string>{
                "onednn-softmax", "cpu-masked-softmax", "onednn-matmul",
                "cpu-weights-blocks", "cpu-key-shares", "cpu-amx-columns",
                "cpu-amx-blocks", "cpu-lane", "cpu-columns",
                "cpu-fused-blocks", "cpu-additive", "cpu-regression"}));
}

// An engine whose own kernels are capped at `cap` (and ATTN_MAX_CPU_ISA),
// on `threads` threads for every call however small, and what it runs on.
struct CpuEngine {
  std::unique_ptr<Engine> engine;
  CpuIsa isa = CpuIsa::kBaseline;  // the copy of the kernels it runs
  bool native_bfloat16 = false;    // bfloat16 products in hardware
  bool amx = false;                // ... on AMX tiles
};

CpuEngine MakeEngine(std::optional<CpuIsa> cap, int threads) {
  EngineOptions options;
  options.max_cpu_isa = cap;
  options.max_threads = threads;
  options.single_thread_below_flops = 0;
  CpuEngine made;
  auto engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return made;
  made.engine = std::move(engine).value();
  made.isa = SelectCpuIsa(cap).value();
  const std::string description = made.engine->backend_descriptions().front();
  made.native_bfloat16 =
      description.find("bf16 attention: native") != std::string::npos;
  made.amx = description.find("oneDNN: avx512_core_amx") != std::string::npos;
  return made;
}

// One attention call's shape and options: 8 query rows over 4,096 keys,
// d = v = 64, float32, unless set otherwise.
struct Call {
  int64_t batch = 1, lq = 8, lk = 4096, d = 64, dv = 64;
  bool weights = false;
  bool causal = false;
  Precision precision = Precision::kFloat32;
  bool held = false;  // keys and values held as bfloat16 bits
  std::vector<int32_t> per_batch_lengths;

  Call& Batch(int64_t n) {
    batch = n;
    return *this;
  }
  Call& Rows(int64_t n) {
    lq = n;
    return *this;
  }
  Call& Keys(int64_t n) {
    lk = n;
    return *this;
  }
  Call& Depths(int64_t depth, int64_t value_depth) {
    d = depth;
    dv = value_depth;
    return *this;
  }
  Call& Weights() {
    weights = true;
    return *this;
  }
  Call& Causal() {
    causal = true;
    return *this;
  }
  Call& In(Precision p) {
    precision = p;
    return *this;
  }
  Call& Held() {
    held = true;
    return *this;
  }
  Call& Lengths(std::vector<int32_t> lengths) {
    per_batch_lengths = std::move(lengths);
    return *this;
  }
};

// Runs `call` on `engine`, checks it against the reference within the
// derived bounds, and returns the implementation that ran.
std::string Implementation(const CpuEngine& engine, const Call& call) {
  std::mt19937 rng(static_cast<uint32_t>(call.lq * 31 + call.lk));
  const Tensor q = RandomNormal(rng, {call.batch, call.lq, call.d});
  const Tensor k = RandomNormal(rng, {call.batch, call.lk, call.d});
  const Tensor v = RandomNormal(rng, {call.batch, call.lk, call.dv});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.causal = call.causal;
  request.precision = call.precision;
  if (!call.per_batch_lengths.empty()) {
    request.valid_lens = ViewOf(call.per_batch_lengths, {call.batch});
  }
  request.return_weights = true;
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  EXPECT_TRUE(expected.ok()) << expected.status();
  if (!expected.ok()) return "";
  const auto bounds = AttentionBounds(request, *expected);
  request.return_weights = call.weights;
  std::vector<uint16_t> k_bits(k.data.size()), v_bits(v.data.size());
  if (call.held) {
    for (size_t i = 0; i < k_bits.size(); ++i) {
      k_bits[i] = BFloat16Bits(k.data[i]);
    }
    for (size_t i = 0; i < v_bits.size(); ++i) {
      v_bits[i] = BFloat16Bits(v.data[i]);
    }
    request.keys.data = request.values.data = nullptr;
    request.keys_bfloat16 = k_bits.data();
    request.values_bfloat16 = v_bits.data();
  }
  auto result = engine.engine->ScaledDotProductAttention(request);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return "";
  EXPECT_EQ(result->backend, "onednn-cpu");
  EXPECT_TRUE(WithinBounds(result->output, expected->output, bounds.output));
  if (call.weights) {
    EXPECT_TRUE(
        WithinBounds(result->weights, expected->weights, bounds.weights));
  }
  return result->implementation;
}

// Every cap of the kernels' instruction set (each lowered to what this CPU
// and ATTN_MAX_CPU_ISA allow), and no cap.
std::vector<std::optional<CpuIsa>> Caps() {
  return {std::nullopt, CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512,
          CpuIsa::kAmx};
}

std::string CapName(std::optional<CpuIsa> cap) {
  return cap ? CpuIsaName(*cap) : "none";
}

TEST(OneDnnBackendTest, EachAttentionImplementationTakesItsCalls) {
  for (const std::optional<CpuIsa> cap : Caps()) {
    const CpuEngine one = MakeEngine(cap, 1);
    const CpuEngine two = MakeEngine(cap, 2);
    ASSERT_NE(one.engine, nullptr);
    ASSERT_NE(two.engine, nullptr);
    SCOPED_TRACE("cap " + CapName(cap) + ", kernels " + CpuIsaName(one.isa));
    // The lane kernel exists in the AVX2 and AVX-512 copies only.
    const bool lanes = one.isa != CpuIsa::kBaseline;
    const std::string lane_or_blocks = lanes ? "cpu-lane" : "cpu-fused-blocks";
    // cpu-columns exists in the AVX-512 copy only.
    const bool columns = one.isa >= CpuIsa::kAvx512;
    const std::string columns_or_blocks =
        columns ? "cpu-columns" : "cpu-fused-blocks";

    // The weights asked for: always the weights blocks.
    EXPECT_EQ(Implementation(one, Call().Weights()), "cpu-weights-blocks");
    EXPECT_EQ(Implementation(two, Call().Keys(8192).Weights()),
              "cpu-weights-blocks");
    // 2-64 rows over 4,096 keys or more: the lane kernel.
    EXPECT_EQ(Implementation(one, Call().Rows(2)), lane_or_blocks);
    EXPECT_EQ(Implementation(one, Call().Rows(64).Keys(4100)), lane_or_blocks);
    // Fewer tasks than threads over 8,192 keys or more: key shares (their
    // passes on the lane kernel or the blocks alike).
    EXPECT_EQ(Implementation(two, Call().Keys(8192)), "cpu-key-shares");
    EXPECT_EQ(Implementation(two, Call().Rows(1).Keys(8192 + 37)),
              "cpu-key-shares");
    // As many tasks as threads, or too few keys to share: no shares.
    EXPECT_EQ(Implementation(two, Call().Batch(2).Keys(8192)), lane_or_blocks);
    EXPECT_EQ(Implementation(two, Call()), lane_or_blocks);
    // A call with fewer tasks than threads over fewer keys than a share
    // takes runs whole (such calls once cut their keys into zero shares).
    EXPECT_EQ(Implementation(two, Call().Rows(4).Keys(100).Depths(8, 8)),
              "cpu-fused-blocks");
    // Outside the lane kernel's reach: the blocks.
    EXPECT_EQ(Implementation(one, Call().Rows(1).Keys(8192)),
              "cpu-fused-blocks");
    // float32, 64 rows or more (past the lane kernel's), d and dv up to 64:
    // cpu-columns; outside its reach, the blocks.
    EXPECT_EQ(Implementation(one, Call().Rows(65)), columns_or_blocks);
    EXPECT_EQ(Implementation(one, Call().Rows(130).Keys(4133)),
              columns_or_blocks);
    EXPECT_EQ(Implementation(one, Call().Rows(64).Keys(100)),
              columns_or_blocks);
    EXPECT_EQ(Implementation(two, Call().Rows(100).Keys(300).Causal()),
              columns_or_blocks);
    EXPECT_EQ(Implementation(one, Call().Rows(63).Keys(100)),
              "cpu-fused-blocks");
    EXPECT_EQ(Implementation(one, Call().Rows(64).Keys(100).Depths(65, 64)),
              "cpu-fused-blocks");
    EXPECT_EQ(Implementation(one, Call().Rows(64).Keys(100).Depths(64, 65)),
              "cpu-fused-blocks");
    EXPECT_EQ(Implementation(one, Call().Depths(64, 12)), "cpu-fused-blocks");
    EXPECT_EQ(Implementation(one, Call().Keys(4095)), "cpu-fused-blocks");
    EXPECT_EQ(Implementation(one, Call().Causal()), "cpu-fused-blocks");
    // Valid lengths: the lane kernel when some row reaches 4,096 keys.
    EXPECT_EQ(
        Implementation(one, Call().Batch(2).Keys(4200).Lengths({4000, 100})),
        "cpu-fused-blocks");
    EXPECT_EQ(
        Implementation(one, Call().Batch(2).Keys(4200).Lengths({0, 4096})),
        lane_or_blocks);

    // bfloat16: where the CPU multiplies it, the lane kernel's own bfloat16
    // products on AVX512-BF16 (not on AMX); elsewhere the floats the
    // operands round to take the float32 paths, and keys and values held
    // as bits stay on the blocks, which widen them a block at a time.
    const std::string bfloat16_lanes =
        one.native_bfloat16
            ? (one.isa == CpuIsa::kAvx512 && !one.amx ? "cpu-lane"
                                                      : "cpu-fused-blocks")
            : lane_or_blocks;
    EXPECT_EQ(Implementation(one, Call().In(Precision::kBFloat16)),
              bfloat16_lanes);
    EXPECT_EQ(Implementation(one, Call().In(Precision::kBFloat16).Held()),
              one.native_bfloat16 ? bfloat16_lanes : "cpu-fused-blocks");
    EXPECT_EQ(
        Implementation(two, Call().Keys(8192).In(Precision::kBFloat16).Held()),
        "cpu-key-shares");
    // 24 rows or more in bfloat16 on AMX tiles: the AMX kernels, the one
    // with transposed scores for 64 rows or more of heads up to 64 whose
    // keys and values lay out in 32 MiB, the other for the rest and for
    // shares of keys held as bits.
    if (one.isa == CpuIsa::kAmx && one.native_bfloat16) {
      EXPECT_EQ(Implementation(one, Call().Rows(64).In(Precision::kBFloat16)),
                "cpu-amx-columns");
      EXPECT_EQ(Implementation(one, Call().Rows(63).In(Precision::kBFloat16)),
                "cpu-amx-blocks");
      EXPECT_EQ(Implementation(
                    one, Call().Rows(70).Keys(300).In(Precision::kBFloat16)),
                "cpu-amx-columns");
      EXPECT_EQ(
          Implementation(one, Call().Rows(70).In(Precision::kBFloat16).Held()),
          "cpu-amx-columns");
      EXPECT_EQ(
          Implementation(one, Call().Rows(33).In(Precision::kBFloat16).Held()),
          "cpu-amx-blocks");
      EXPECT_EQ(Implementation(one, Call().Rows(70).In(Precision::kBFloat16)
                                        .Depths(66, 64)),
                "cpu-amx-blocks");
      EXPECT_EQ(Implementation(one, Call().Rows(70).In(Precision::kBFloat16)
                                        .Depths(64, 66)),
                "cpu-amx-blocks");
      // 262,144 keys of d = dv = 64: 64 MiB laid out.
      EXPECT_EQ(Implementation(one, Call().Rows(64).Keys(262144).In(
                                        Precision::kBFloat16).Held()),
                "cpu-amx-blocks");
      EXPECT_EQ(Implementation(two, Call().Rows(40).Keys(8192).In(
                                        Precision::kBFloat16).Held()),
                "cpu-key-shares");
      EXPECT_EQ(Implementation(one, Call().Rows(24).In(Precision::kBFloat16)
                                        .Depths(63, 64)),
                "cpu-fused-blocks");  // odd d: pairs would straddle rows
      EXPECT_EQ(Implementation(one, Call().Rows(23).In(Precision::kBFloat16)),
                "cpu-fused-blocks");
    }
    // float16: float32 products of the rounded operands.
    EXPECT_EQ(Implementation(one, Call().In(Precision::kFloat16)),
              lane_or_blocks);
  }
}

// The process-wide cap (ATTN_MAX_CPU_ISA) lowers the kernels as the
// engine's own does: at baseline, no lane kernel.
TEST(OneDnnBackendTest, TheProcessWideCapTurnsTheLaneKernelOff) {
  const char* old = std::getenv(kMaxCpuIsaVariable);
  const std::string saved = old != nullptr ? old : "";
  setenv(kMaxCpuIsaVariable, "baseline", 1);
  const CpuEngine capped = MakeEngine(std::nullopt, 1);
  if (old != nullptr) {
    setenv(kMaxCpuIsaVariable, saved.c_str(), 1);
  } else {
    unsetenv(kMaxCpuIsaVariable);
  }
  ASSERT_NE(capped.engine, nullptr);
  EXPECT_EQ(capped.isa, CpuIsa::kBaseline);
  EXPECT_EQ(Implementation(capped, Call()), "cpu-fused-blocks");
}

TEST(OneDnnBackendTest, EachOtherOperationNamesItsImplementation) {
  const CpuEngine cpu = MakeEngine(std::nullopt, 2);
  ASSERT_NE(cpu.engine, nullptr);
  std::mt19937 rng(5);
  const Tensor x = RandomNormal(rng, {2, 3, 40});
  const std::vector<int32_t> lengths = {7, 40};
  MaskedSoftmaxRequest softmax{x.view(), {}};
  auto plain = cpu.engine->MaskedSoftmax(softmax);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->implementation, "onednn-softmax");
  softmax.valid_lens = ViewOf(lengths, {2});
  auto masked = cpu.engine->MaskedSoftmax(softmax);
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ(masked->implementation, "cpu-masked-softmax");

  const Tensor a = RandomNormal(rng, {2, 3, 40});
  const Tensor b = RandomNormal(rng, {2, 40, 5});
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    auto product = cpu.engine->BatchMatmul({a.view(), b.view(), precision});
    ASSERT_TRUE(product.ok()) << product.status();
    EXPECT_EQ(product->implementation, "onednn-matmul");
    EXPECT_EQ(product->backend, "onednn-cpu");
  }

  const Tensor w = RandomNormal(rng, {6, 40}), w_v = RandomNormal(rng, {6});
  AdditiveAttentionRequest additive;
  additive.queries = x.view();
  additive.keys = a.view();
  additive.values = x.view();
  additive.w_q = w.view();
  additive.w_k = w.view();
  additive.w_v = w_v.view();
  auto scored = cpu.engine->AdditiveAttention(additive);
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_EQ(scored->implementation, "cpu-additive");

  NadarayaWatsonRequest regression;
  regression.x_train = TensorView{a.data.data(), {20}};
  regression.y_train = TensorView{b.data.data(), {20}};
  regression.x_query = TensorView{x.data.data(), {10}};
  auto predicted = cpu.engine->NadarayaWatson(regression);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_EQ(predicted->implementation, "cpu-regression");
}

}  // namespace
}  // namespace attn
