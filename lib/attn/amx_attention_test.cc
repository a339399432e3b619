// bfloat16 attention on AMX tiles (cpu-amx-columns, cpu-amx-blocks, and
// cpu-key-shares running its shares on them) against the double reference
// within the derived bounds, on shapes that leave every tile partly filled:
// rows, keys, d and dv that are not multiples of 16 or 32, masks, causal
// rows, the Gaussian score, keys and values held as bfloat16. Each case runs
// on cpu-amx-columns where it takes the call, and again with it skipped
// (EngineOptions::skipped_cpu_implementations) on cpu-amx-blocks. On CPUs
// without AMX tiles (or where the process may not use them) every case is
// skipped as such: the other paths are tested by attention_test everywhere.
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
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
using ::attn::testing::RoundToBFloat16Bits;
using ::attn::testing::ViewOf;
using ::attn::testing::WithinBounds;

// Whether this CPU has AMX tiles this process may use: the one reason these
// tests skip. (Under an ATTN_MAX_CPU_ISA cap below amx they fail, as they
// should: CTest runs them uncapped.)
bool AmxHere() { return DetectCpuIsa() == CpuIsa::kAmx; }

// A bfloat16 attention request over q, k and v.
AttentionRequest BFloat16Request(const Tensor& q, const Tensor& k,
                                 const Tensor& v) {
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.precision = Precision::kBFloat16;
  return request;
}

enum class Lengths { kNone, kPerBatch, kPerRow };

struct Case {
  int64_t batch, heads, lq, lk, d, dv;
  Lengths lengths;
  bool causal;
  ScoreKind score;
  std::string label;
};

constexpr char kColumns[] = "cpu-amx-columns";
constexpr char kBlocks[] = "cpu-amx-blocks";

std::unique_ptr<Engine> MakeEngine(bool always_parallel,
                                   std::optional<CpuIsa> cap = std::nullopt,
                                   std::vector<std::string> skipped = {}) {
  EngineOptions options;
  if (always_parallel) options.single_thread_below_flops = 0.0;
  options.max_cpu_isa = cap;
  options.skipped_cpu_implementations = std::move(skipped);
  return Engine::Create(options).value();
}

// What an engine skips so that `kernel` runs the calls both AMX kernels
// would take: nothing for cpu-amx-columns, first in the list; it, for
// cpu-amx-blocks.
std::vector<std::string> SkippedFor(std::string_view kernel) {
  if (kernel == kBlocks) return {kColumns};
  return {};
}

// The calls cpu-amx-columns takes among these tests' (small enough to lay
// out): the dot product over heads of up to 64, 64 rows or more.
bool ColumnsTake(ScoreKind score, int64_t lq, int64_t d, int64_t dv) {
  return score == ScoreKind::kDotProduct && lq >= 64 && d <= 64 && dv <= 64;
}

class AmxAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AmxAttentionTest, WithinDerivedBoundOnTiles) {
  if (!AmxHere()) GTEST_SKIP() << "no AMX tiles on this CPU";
  const Case& c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.lq * 131 + c.lk * 7 + c.d));
  const Tensor q = RandomNormal(rng, {c.batch, c.heads, c.lq, c.d});
  const Tensor k = RandomNormal(rng, {c.batch, c.heads, c.lk, c.d});
  const Tensor v = RandomNormal(rng, {c.batch, c.heads, c.lk, c.dv});
  std::vector<int32_t> lengths;
  AttentionRequest request = BFloat16Request(q, k, v);
  if (c.lengths == Lengths::kPerBatch) {
    lengths = RandomLengths(rng, c.batch, 0, c.lk);
    lengths.back() = c.lk;
    request.valid_lens = ViewOf(lengths, {c.batch});
  } else if (c.lengths == Lengths::kPerRow) {
    lengths = RandomLengths(rng, c.batch * c.lq, 0, c.lk);
    request.valid_lens = ViewOf(lengths, {c.batch, c.lq});
  }
  request.causal = c.causal;
  request.score = c.score;
  request.return_weights = true;
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const auto bounds = AttentionBounds(request, *expected);
  request.return_weights = false;
  for (const std::string_view kernel : {kColumns, kBlocks}) {
    for (bool always_parallel : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << (always_parallel ? "every thread" : "default threads")
                   << ", meant for " << kernel);
      auto result =
          MakeEngine(always_parallel, std::nullopt, SkippedFor(kernel))
              ->ScaledDotProductAttention(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->implementation,
                kernel == kColumns && ColumnsTake(c.score, c.lq, c.d, c.dv)
                    ? kColumns
                    : kBlocks);
      EXPECT_TRUE(
          WithinBounds(result->output, expected->output, bounds.output));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AmxAttentionTest,
    ::testing::Values(
        // The fewest rows it takes (24: a pair of row tiles, the second
        // half empty), a pair of d, keys short of one tile.
        Case{1, 1, 24, 5, 2, 2, Lengths::kNone, false, ScoreKind::kDotProduct,
             "rows24_keys5_d2"},
        Case{2, 1, 25, 31, 34, 18, Lengths::kPerBatch, false,
             ScoreKind::kDotProduct, "rows25_keys31_d34_dv18_lengths"},
        Case{3, 2, 33, 65, 64, 64, Lengths::kPerRow, false,
             ScoreKind::kDotProduct, "rows33_keys65_rowlengths"},
        Case{1, 2, 128, 300, 64, 64, Lengths::kNone, true,
             ScoreKind::kDotProduct, "rows128_keys300_causal"},
        // More than one block of query rows: keys laid out once per call.
        Case{2, 1, 200, 513, 130, 96, Lengths::kPerRow, false,
             ScoreKind::kDotProduct, "rows200_keys513_d130_dv96"},
        Case{1, 1, 257, 257, 64, 64, Lengths::kNone, true,
             ScoreKind::kDotProduct, "rows257_causal_self"},
        Case{2, 1, 97, 700, 40, 24, Lengths::kPerBatch, false,
             ScoreKind::kGaussian, "rows97_keys700_gaussian"},
        Case{1, 1, 300, 1000, 32, 32, Lengths::kPerRow, true,
             ScoreKind::kGaussian, "rows300_gaussian_causal_lengths"},
        // cpu-amx-columns' edges: tasks of 128 rows in groups of 32, blocks
        // of 64 keys, queries that see no key, heads of 2 and 64.
        Case{2, 2, 64, 1000, 64, 64, Lengths::kPerRow, true,
             ScoreKind::kDotProduct, "rows64_keys1000_rowlengths_causal"},
        Case{3, 1, 65, 129, 32, 30, Lengths::kPerBatch, false,
             ScoreKind::kDotProduct, "rows65_keys129_d32_dv30_lengths"},
        Case{1, 1, 100, 64, 62, 2, Lengths::kNone, true, ScoreKind::kDotProduct,
             "rows100_keys64_dv2_causal"},
        Case{1, 3, 32, 2000, 64, 64, Lengths::kPerRow, false,
             ScoreKind::kDotProduct, "rows32_keys2000_rowlengths"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.label;
    });

// Later key blocks that outscore the earlier ones: by more than the lazy
// rescaling's margin (each block's scores past the last block's max by
// ~30 after scaling: every block rescales the row), and by less (~3: the
// exponentials stay relative to an older max, up to e^8). Both against the
// reference within the derived bound, masks included.
TEST(AmxRescaleTest, RisingScoresAcrossKeyBlocks) {
  if (!AmxHere()) GTEST_SKIP() << "no AMX tiles on this CPU";
  for (const float rise : {30.0f, 3.0f}) {
    SCOPED_TRACE(::testing::Message() << "rise per block " << rise);
    std::mt19937 rng(17);
    const int64_t lq = 70, lk = 1500, d = 64, dv = 32;
    Tensor q = RandomNormal(rng, {1, lq, d});
    Tensor k = RandomNormal(rng, {1, lk, d});
    const Tensor v = RandomNormal(rng, {1, lk, dv});
    // Block b's scores (of 256 keys) sit near b * rise.
    RiseScoresPerBlock(q, k, rise, 256);
    const std::vector<int32_t> lengths = RandomLengths(rng, lq, 0, lk);
    AttentionRequest request = BFloat16Request(q, k, v);
    request.valid_lens = ViewOf(lengths, {1, lq});
    request.return_weights = true;
    auto expected = ReferenceEngine().ScaledDotProductAttention(request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const auto bounds = AttentionBounds(request, *expected);
    request.return_weights = false;
    for (const std::string_view kernel : {kColumns, kBlocks}) {
      for (bool always_parallel : {false, true}) {
        SCOPED_TRACE(kernel);
        auto result =
            MakeEngine(always_parallel, std::nullopt, SkippedFor(kernel))
                ->ScaledDotProductAttention(request);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->implementation, kernel);
        EXPECT_TRUE(
            WithinBounds(result->output, expected->output, bounds.output));
      }
    }
  }
}

// A memory held as bfloat16 bits over enough keys that its query rows'
// keys are shared out among the threads (cpu-key-shares running AMX tasks),
// or not (one thread): the same as the floats the bits hold, and within the
// derived bound of the reference; on cpu-amx-columns where it takes the
// call (64 rows or more, no shares), and with it skipped on
// cpu-amx-blocks.
TEST(AmxHeldMemoryTest, SharesOnTilesMatchTheReference) {
  if (!AmxHere()) GTEST_SKIP() << "no AMX tiles on this CPU";
  std::mt19937 rng(5);
  const int64_t lk = 9000, d = 64, dv = 48;
  Tensor k = RandomNormal(rng, {1, lk, d});
  Tensor v = RandomNormal(rng, {1, lk, dv});
  const std::vector<uint16_t> k_bits = RoundToBFloat16Bits(k);
  const std::vector<uint16_t> v_bits = RoundToBFloat16Bits(v);
  // (200 rows: two blocks of query rows, the memory laid out once.)
  for (const int64_t lq : {24, 45, 128, 200}) {
    SCOPED_TRACE(::testing::Message() << "lq " << lq);
    const Tensor q = RandomNormal(rng, {1, lq, d});
    const std::vector<int32_t> lengths = RandomLengths(rng, lq, 0, lk);
    AttentionRequest floats = BFloat16Request(q, k, v);
    floats.valid_lens = ViewOf(lengths, {1, lq});
    AttentionRequest held = floats;
    held.keys.data = nullptr;
    held.values.data = nullptr;
    held.keys_bfloat16 = k_bits.data();
    held.values_bfloat16 = v_bits.data();
    floats.return_weights = true;
    auto expected = ReferenceEngine().ScaledDotProductAttention(floats);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const auto bounds = AttentionBounds(floats, *expected);
    floats.return_weights = false;
    for (const std::string_view kernel : {kColumns, kBlocks}) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message()
                     << threads << " threads, meant for " << kernel);
        EngineOptions options;
        options.max_threads = threads;
        options.single_thread_below_flops = 0.0;
        options.skipped_cpu_implementations = SkippedFor(kernel);
        auto engine = Engine::Create(options).value();
        auto from_held = engine->ScaledDotProductAttention(held);
        auto from_floats = engine->ScaledDotProductAttention(floats);
        ASSERT_TRUE(from_held.ok()) << from_held.status();
        ASSERT_TRUE(from_floats.ok()) << from_floats.status();
        // Two threads share one task's keys out; one runs it whole, as it
        // does two tasks.
        const std::string_view expected_kernel =
            threads == 2 && lq <= 128        ? "cpu-key-shares"
            : kernel == kColumns && lq >= 64 ? kColumns
                                             : kBlocks;
        EXPECT_EQ(from_held->implementation, expected_kernel);
        EXPECT_EQ(from_floats->implementation, expected_kernel);
        EXPECT_EQ(from_held->output.data, from_floats->output.data);
        EXPECT_TRUE(
            WithinBounds(from_held->output, expected->output, bounds.output));
      }
    }
  }
}

// Capped at avx512, the same call runs without tiles (the switch that tests
// the other paths on this machine), within the same bound.
TEST(AmxSwitchTest, CapAtAvx512TurnsTheTilesOff) {
  if (!AmxHere()) GTEST_SKIP() << "no AMX tiles on this CPU";
  std::mt19937 rng(9);
  const Tensor q = RandomNormal(rng, {2, 64, 64});
  const Tensor k = RandomNormal(rng, {2, 300, 64});
  const Tensor v = RandomNormal(rng, {2, 300, 64});
  AttentionRequest request = BFloat16Request(q, k, v);
  request.return_weights = true;
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok());
  request.return_weights = false;
  auto engine = MakeEngine(false, CpuIsa::kAvx512);
  EXPECT_NE(engine->backend_descriptions().front().find("own kernels: avx512;"),
            std::string::npos)
      << engine->backend_descriptions().front();
  auto result = engine->ScaledDotProductAttention(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->implementation, "cpu-fused-blocks");
  EXPECT_TRUE(WithinBounds(result->output, expected->output,
                           AttentionBounds(request, *expected).output));
  // And float32 calls never take the tiles.
  request.precision = Precision::kFloat32;
  auto float32 = MakeEngine(false)->ScaledDotProductAttention(request);
  ASSERT_TRUE(float32.ok());
  EXPECT_NE(float32->implementation, kBlocks);
  EXPECT_NE(float32->implementation, kColumns);
}

// Scores past float's range (finite inputs whose products overflow) reach
// the output as NaN from the tiles, and the engine answers with the
// reference's result, as on every other path.
TEST(AmxOverflowTest, OverflowedScoresGiveTheReferenceResult) {
  if (!AmxHere()) GTEST_SKIP() << "no AMX tiles on this CPU";
  std::mt19937 rng(3);
  Tensor q = RandomNormal(rng, {1, 32, 64});
  Tensor k = RandomNormal(rng, {1, 40, 64});
  const Tensor v = RandomNormal(rng, {1, 40, 16});
  for (int c = 0; c < 64; ++c) {
    q.data[5 * 64 + c] = 3e37f;
    k.data[7 * 64 + c] = 3e37f;
  }
  AttentionRequest request = BFloat16Request(q, k, v);
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (const std::string_view kernel : {kColumns, kBlocks}) {
    SCOPED_TRACE(kernel);
    auto result = MakeEngine(false, std::nullopt, SkippedFor(kernel))
                      ->ScaledDotProductAttention(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output.data, expected->output.data);
  }
}

// The engine leaves bfloat16's range check to the tiles where they round
// every operand element themselves, and checks after the call where they
// did not: an element past the range is refused by name wherever it is,
// read by the tiles or not (keys past every row's valid length, the last
// element), whichever way the keys were laid out (one query block: per
// block; two: once per call); the largest value that rounds finite is
// taken.
TEST(AmxRangeTest, RefusesAnElementPastBFloat16sRangeWhereverItIs) {
  if (!AmxHere()) GTEST_SKIP() << "no AMX tiles on this CPU";
  struct Layout {
    int64_t batch, lq, lk;
    bool lengths, causal;
    const char* label;
  };
  for (const std::string_view kernel : {kColumns, kBlocks}) {
    SCOPED_TRACE(kernel);
    const std::vector<std::string> skipped = SkippedFor(kernel);
    for (const Layout& layout :
         {Layout{1, 64, 300, false, false, "one query block"},
          Layout{2, 200, 70, false, false, "two query blocks"},
          Layout{2, 64, 300, true, false, "lengths short of the last keys"},
          Layout{1, 70, 300, false, true, "causal"}}) {
      SCOPED_TRACE(layout.label);
      std::mt19937 rng(static_cast<unsigned>(layout.lq + layout.lk));
      Tensor q = RandomNormal(rng, {layout.batch, layout.lq, 16});
      Tensor k = RandomNormal(rng, {layout.batch, layout.lk, 16});
      Tensor v = RandomNormal(rng, {layout.batch, layout.lk, 8});
      std::vector<int32_t> lengths(layout.batch, 100);
      for (auto [name, tensor] :
           {std::pair{"queries", &q}, std::pair{"keys", &k},
            std::pair{"values", &v}}) {
        const int64_t count = static_cast<int64_t>(tensor->data.size());
        for (const int64_t element : {int64_t{0}, count / 2 + 3, count - 1}) {
          SCOPED_TRACE(::testing::Message() << name << " element " << element);
          const float kept = tensor->data[element];
          for (const float huge : {3.4e38f, -3.4e38f, 3.3e38f}) {
            tensor->data[element] = huge;
            AttentionRequest request = BFloat16Request(q, k, v);
            if (layout.lengths) {
              request.valid_lens = ViewOf(lengths, {layout.batch});
            }
            request.causal = layout.causal;
            auto result = MakeEngine(false, std::nullopt, skipped)
                              ->ScaledDotProductAttention(request);
            if (std::fabs(huge) < 3.39e38f) {
              EXPECT_TRUE(result.ok()) << result.status();
              continue;
            }
            ASSERT_EQ(result.status().code(),
                      absl::StatusCode::kInvalidArgument)
                << huge;
            EXPECT_NE(result.status().message().find(
                          absl::StrCat(name, ": element ", element, " ")),
                      std::string::npos)
                << result.status();
          }
          tensor->data[element] = kept;
        }
      }
      // In range, the tiles take it.
      AttentionRequest request = BFloat16Request(q, k, v);
      auto result = MakeEngine(false, std::nullopt, skipped)
                        ->ScaledDotProductAttention(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->implementation, kernel);
    }
  }
}

}  // namespace
}  // namespace attn
