// float32 attention on cpu-columns (scores taken transposed, the softmax
// down the keys, both products as register tiles) against the double
// reference within the derived bounds, on shapes that leave its tasks
// (64 query rows), key blocks (64), register tiles (6 rows) and transposes
// (16 x 16) partly filled: every case runs on cpu-columns where it takes the
// call, and again with it skipped (EngineOptions::skipped_cpu_implementations)
// on the implementation after it. The kernel is in the avx512 copy only: on
// CPUs without AVX-512 (or under a cap below it) every case is skipped as
// such, and attention_test covers the other paths everywhere.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "attn/cpu_isa.h"
#include "attn/engine.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AttentionBounds;
using ::attn::testing::RandomLengths;
using ::attn::testing::RandomNormal;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::RiseScoresPerBlock;
using ::attn::testing::ViewOf;
using ::attn::testing::WithinBounds;

constexpr char kColumns[] = "cpu-columns";

// Whether the engines here run the avx512 copy of the kernels: the one
// reason these tests skip.
bool Avx512Here() {
  const auto isa = SelectCpuIsa(std::nullopt);
  return isa.ok() && *isa >= CpuIsa::kAvx512;
}

std::unique_ptr<Engine> MakeEngine(bool always_parallel, bool skip_columns) {
  EngineOptions options;
  if (always_parallel) options.single_thread_below_flops = 0.0;
  if (skip_columns) options.skipped_cpu_implementations = {kColumns};
  return Engine::Create(options).value();
}

// A float32 attention request over q, k and v.
AttentionRequest FloatRequest(const Tensor& q, const Tensor& k,
                              const Tensor& v) {
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  return request;
}

enum class Lengths { kNone, kPerBatch, kPerRow };

struct Case {
  int64_t batch, heads, lq, lk, d, dv;
  Lengths lengths;
  bool causal;
  std::string label;
};

// Runs `request` (float32, no weights) on cpu-columns and with it skipped,
// each on the default threads and on every thread, and checks each output
// against the reference's within the derived bound. `columns_take` says
// whether cpu-columns should take the call.
void ExpectBothWithinBound(AttentionRequest request, bool columns_take) {
  request.return_weights = true;
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const auto bounds = AttentionBounds(request, *expected);
  request.return_weights = false;
  for (const bool skip_columns : {false, true}) {
    for (const bool always_parallel : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << (always_parallel ? "every thread" : "default threads")
                   << (skip_columns ? ", cpu-columns skipped" : ""));
      auto result = MakeEngine(always_parallel, skip_columns)
                        ->ScaledDotProductAttention(request);
      ASSERT_TRUE(result.ok()) << result.status();
      if (skip_columns || !columns_take) {
        EXPECT_NE(result->implementation, kColumns);
      } else {
        EXPECT_EQ(result->implementation, kColumns);
      }
      EXPECT_TRUE(
          WithinBounds(result->output, expected->output, bounds.output));
    }
  }
}

class ColumnsAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(ColumnsAttentionTest, WithinDerivedBound) {
  if (!Avx512Here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const Case& c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.lq * 131 + c.lk * 7 + c.d));
  const Tensor q = RandomNormal(rng, {c.batch, c.heads, c.lq, c.d});
  const Tensor k = RandomNormal(rng, {c.batch, c.heads, c.lk, c.d});
  const Tensor v = RandomNormal(rng, {c.batch, c.heads, c.lk, c.dv});
  AttentionRequest request = FloatRequest(q, k, v);
  std::vector<int32_t> lengths;
  if (c.lengths == Lengths::kPerBatch) {
    lengths = RandomLengths(rng, c.batch, 0, c.lk);
    lengths.back() = static_cast<int32_t>(c.lk);
    lengths.front() = 0;  // a batch entry whose rows see no key
    request.valid_lens = ViewOf(lengths, {c.batch});
  } else if (c.lengths == Lengths::kPerRow) {
    lengths = RandomLengths(rng, c.batch * c.lq, 0, c.lk);
    request.valid_lens = ViewOf(lengths, {c.batch, c.lq});
  }
  request.causal = c.causal;
  ExpectBothWithinBound(request, c.lq >= 64 && c.d <= 64 && c.dv <= 64);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ColumnsAttentionTest,
    ::testing::Values(
        // One task exactly; keys short of one register tile; d and dv of 1.
        Case{1, 1, 64, 5, 1, 1, Lengths::kNone, false, "rows64_keys5_d1_dv1"},
        // A task's tail of one row; keys one past a block; tile remainders
        // (65 = 10 x 6 + 5 keys in the first block, dv 7 = 6 + 1).
        Case{2, 1, 65, 65, 17, 7, Lengths::kPerBatch, false,
             "rows65_keys65_d17_dv7_lengths"},
        // Several tasks per head and several heads; per-row lengths.
        Case{2, 3, 200, 130, 33, 48, Lengths::kPerRow, false,
             "rows200_keys130_heads3_rowlengths"},
        // Causal rows over many blocks; the largest heads it takes.
        Case{1, 2, 257, 300, 64, 64, Lengths::kNone, true,
             "rows257_keys300_causal"},
        Case{2, 1, 128, 1000, 64, 64, Lengths::kPerRow, true,
             "rows128_keys1000_rowlengths_causal"},
        // One key, and fewer keys than rows with a causal mask.
        Case{1, 1, 100, 1, 16, 16, Lengths::kNone, false, "rows100_keys1"},
        Case{1, 1, 127, 63, 2, 2, Lengths::kNone, true,
             "rows127_keys63_causal"},
        // Outside its reach: 63 rows, and d or dv of 65 (the next one takes
        // them).
        Case{1, 1, 63, 200, 64, 64, Lengths::kNone, false, "rows63"},
        Case{1, 1, 64, 200, 65, 64, Lengths::kNone, false, "d65"},
        Case{1, 1, 64, 200, 64, 65, Lengths::kNone, false, "dv65"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.label;
    });

// Later key blocks that outscore the earlier ones: by much (each block's
// scores ~30 past the last block's max after scaling: every block rescales
// every query's sum and output) and by little (~3), masks included; against
// the reference within the derived bound, which allows one rescale per 64
// keys.
TEST(ColumnsRescaleTest, RisingScoresAcrossKeyBlocks) {
  if (!Avx512Here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const float rise : {30.0f, 3.0f}) {
    SCOPED_TRACE(::testing::Message() << "rise per block " << rise);
    std::mt19937 rng(17);
    const int64_t lq = 70, lk = 700, d = 64, dv = 32;
    Tensor q = RandomNormal(rng, {1, lq, d});
    Tensor k = RandomNormal(rng, {1, lk, d});
    const Tensor v = RandomNormal(rng, {1, lk, dv});
    // Block b's scores (of 64 keys) sit near b * rise.
    RiseScoresPerBlock(q, k, rise, 64);
    const std::vector<int32_t> lengths = RandomLengths(rng, lq, 0, lk);
    AttentionRequest request = FloatRequest(q, k, v);
    request.valid_lens = ViewOf(lengths, {1, lq});
    ExpectBothWithinBound(request, true);
  }
}

// A task's two groups of 64 rows mask their own rows: in each 128-row task
// one group attends to every key (its blocks need no mask) and the other
// to a random length each, in either order.
TEST(ColumnsMaskTest, EachGroupOfRowsKeepsItsOwnMask) {
  if (!Avx512Here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const int64_t lq = 200, lk = 300, d = 32, dv = 16;
  for (const bool whole_first : {true, false}) {
    SCOPED_TRACE(whole_first ? "first group whole" : "second group whole");
    std::mt19937 rng(whole_first ? 21 : 22);
    const Tensor q = RandomNormal(rng, {1, lq, d});
    const Tensor k = RandomNormal(rng, {1, lk, d});
    const Tensor v = RandomNormal(rng, {1, lk, dv});
    std::vector<int32_t> lengths = RandomLengths(rng, lq, 0, lk);
    for (int64_t row = 0; row < lq; ++row) {
      if ((row / 64 % 2 == 0) == whole_first) lengths[row] = lk;
    }
    AttentionRequest request = FloatRequest(q, k, v);
    request.valid_lens = ViewOf(lengths, {1, lq});
    ExpectBothWithinBound(request, true);
  }
}

// Scores past float's range (finite inputs whose products overflow) reach
// the output as NaN, which the kernel's probe of its outputs reports, and
// the engine answers with the reference's result, as on every other path.
TEST(ColumnsOverflowTest, OverflowedScoresGiveTheReferenceResult) {
  if (!Avx512Here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(3);
  Tensor q = RandomNormal(rng, {2, 64, 64});
  Tensor k = RandomNormal(rng, {2, 80, 64});
  const Tensor v = RandomNormal(rng, {2, 80, 16});
  for (int c = 0; c < 64; ++c) {
    q.data[(64 + 5) * 64 + c] = 1e19f;
    k.data[(80 + 7) * 64 + c] = 1e19f;
  }
  AttentionRequest request = FloatRequest(q, k, v);
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (const bool always_parallel : {false, true}) {
    auto result =
        MakeEngine(always_parallel, false)->ScaledDotProductAttention(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output.data, expected->output.data);
  }
}

// Capped at avx2, the same call runs on another implementation (the switch
// that tests the other paths on this machine), within the same bound.
TEST(ColumnsSwitchTest, CapBelowAvx512TurnsItOff) {
  if (!Avx512Here()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(9);
  const Tensor q = RandomNormal(rng, {2, 64, 64});
  const Tensor k = RandomNormal(rng, {2, 300, 64});
  const Tensor v = RandomNormal(rng, {2, 300, 64});
  AttentionRequest request = FloatRequest(q, k, v);
  request.return_weights = true;
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok());
  request.return_weights = false;
  EngineOptions options;
  options.max_cpu_isa = CpuIsa::kAvx2;
  auto result =
      Engine::Create(options).value()->ScaledDotProductAttention(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->implementation, "cpu-fused-blocks");
  EXPECT_TRUE(WithinBounds(result->output, expected->output,
                           AttentionBounds(request, *expected).output));
  // Uncapped, cpu-columns; the Gaussian score and bfloat16 calls never
  // take it.
  auto columns = MakeEngine(false, false)->ScaledDotProductAttention(request);
  ASSERT_TRUE(columns.ok());
  EXPECT_EQ(columns->implementation, kColumns);
  request.score = ScoreKind::kGaussian;
  auto gaussian = MakeEngine(false, false)->ScaledDotProductAttention(request);
  ASSERT_TRUE(gaussian.ok());
  EXPECT_NE(gaussian->implementation, kColumns);
  request.score = ScoreKind::kDotProduct;
  request.precision = Precision::kBFloat16;
  auto bfloat16 = MakeEngine(false, false)->ScaledDotProductAttention(request);
  ASSERT_TRUE(bfloat16.ok());
  EXPECT_NE(bfloat16->implementation, kColumns);
}

}  // namespace
}  // namespace attn
