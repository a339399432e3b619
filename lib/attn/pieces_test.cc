// Attention over pieces (attn/pieces.h): the log-sum-exp every path gives,
// against the double reference within derived bounds, and calls over pieces
// of a memory merged into the answer over the whole, weights included.
#include "attn/pieces.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/engine.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AttentionBounds;
using ::attn::testing::ErrorBounds;
using ::attn::testing::OptimizedEngine;
using ::attn::testing::RandomNormal;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::RoundToBFloat16Bits;
using ::attn::testing::Threads;
using ::attn::testing::ViewOf;
using ::attn::testing::WithinBounds;

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// Where `expected` is -inf (a row with no key), `actual` must be exactly
// that; WithinBounds leaves those elements to this.
::testing::AssertionResult SameNoKeyRows(const Tensor& actual,
                                         const Tensor& expected) {
  if (actual.shape != expected.shape) {
    return ::testing::AssertionFailure() << "shapes differ";
  }
  for (size_t i = 0; i < expected.data.size(); ++i) {
    if ((expected.data[i] == kNegativeInfinity) !=
        (actual.data[i] == kNegativeInfinity)) {
      return ::testing::AssertionFailure()
             << "row " << i << ": got " << actual.data[i] << ", expected "
             << expected.data[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The largest bound over the rows that have a key.
double LargestBound(const Tensor& bound) {
  double largest = 0.0;
  for (float b : bound.data) largest = std::max<double>(largest, b);
  return largest;
}

// The log-sum-exp of the paths attention_test does not reach with it (that
// test asks for it over every float32 shape, mask and score): bfloat16
// products, on blocks, AMX tiles or lanes, and a memory's calls, whose keys
// are shared out among threads.
struct ShapeCase {
  int64_t batch, lq, lk, d, dv;
  ScoreKind score;
  Precision precision;
  std::string label;
};

std::string ShapeName(const ::testing::TestParamInfo<ShapeCase>& info) {
  return info.param.label;
}

class LogSumExpTest : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(LogSumExpTest, MatchesTheReference) {
  const ShapeCase& c = GetParam();
  std::mt19937 rng(77 + c.lq * 13 + c.lk);
  const Tensor q = RandomNormal(rng, {c.batch, c.lq, c.d});
  const Tensor k = RandomNormal(rng, {c.batch, c.lk, c.d});
  const Tensor v = RandomNormal(rng, {c.batch, c.lk, c.dv});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  // With two batch entries, entry 0 attends to no key: its rows'
  // log-sum-exp is -inf. One (a memory's call) has its keys shared out.
  const std::vector<int32_t> lengths = {0, static_cast<int32_t>(c.lk)};
  if (c.batch == 2) request.valid_lens = ViewOf(lengths, {2});
  request.score = c.score;
  request.precision = c.precision;
  request.return_log_sum_exp = true;
  request.return_weights = true;
  auto exact = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(exact.ok()) << exact.status();
  const ErrorBounds bounds = AttentionBounds(request, *exact);
  for (const Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
    for (const bool weights : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "threads " << int(threads)
                                        << ", weights " << weights);
      request.return_weights = weights;
      auto got = OptimizedEngine(threads).ScaledDotProductAttention(request);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->implementation,
                weights ? "cpu-weights-blocks" : "cpu-key-shares");
      EXPECT_TRUE(WithinBounds(got->log_sum_exp, exact->log_sum_exp,
                               bounds.log_sum_exp));
      EXPECT_TRUE(SameNoKeyRows(got->log_sum_exp, exact->log_sum_exp));
      EXPECT_TRUE(WithinBounds(got->output, exact->output, bounds.output));
    }
  }
}

constexpr ScoreKind kDot = ScoreKind::kDotProduct;
constexpr ScoreKind kGauss = ScoreKind::kGaussian;
constexpr Precision kF32 = Precision::kFloat32;
constexpr Precision kBF16 = Precision::kBFloat16;

INSTANTIATE_TEST_SUITE_P(
    Shapes, LogSumExpTest,
    ::testing::Values(
        ShapeCase{2, 6, 40, 6, 4, kGauss, kBF16, "gaussian_bf16"},
        ShapeCase{2, 33, 300, 64, 64, kDot, kBF16, "blocks_bf16"},
        ShapeCase{2, 130, 260, 64, 32, kDot, kBF16, "query_blocks_bf16"},
        ShapeCase{1, 3, 9000, 64, 64, kDot, kF32, "memory_shares"},
        ShapeCase{1, 3, 9000, 64, 64, kGauss, kF32, "memory_shares_gaussian"},
        ShapeCase{1, 40, 9000, 64, 64, kDot, kBF16, "memory_shares_bf16"}),
    ShapeName);

// The reference's log-sum-exp is the definition: every key with the same
// score s gives s + log(n), and the Gaussian score is -|q - k|^2 / 2, all of
// it (the kernels leave -|q|^2 / 2 out of their scores and put it back).
TEST(LogSumExpReferenceTest, IsTheDefinition) {
  for (const ScoreKind score : {kDot, kGauss}) {
    for (const Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
      const int64_t n = 300, d = 4;
      Tensor q = Tensor::Zeros({1, 2, d});
      Tensor k = Tensor::Zeros({1, n, d});
      const Tensor v = Tensor::Zeros({1, n, 2});
      const float query[2][4] = {{0.5f, -1.0f, 2.0f, 0.25f},
                                 {3.0f, 0.0f, -2.0f, 1.0f}};
      const float key[4] = {1.0f, 0.5f, -0.75f, 2.0f};
      for (int64_t r = 0; r < 2; ++r) {
        for (int64_t c = 0; c < d; ++c) q.data[r * d + c] = query[r][c];
      }
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < d; ++c) k.data[j * d + c] = key[c];
      }
      AttentionRequest request;
      request.queries = q.view();
      request.keys = k.view();
      request.values = v.view();
      request.score = score;
      request.scale = 0.5f;
      request.return_log_sum_exp = true;
      for (Engine* engine :
           {&ReferenceEngine(), &OptimizedEngine(threads)}) {
        auto result = engine->ScaledDotProductAttention(request);
        ASSERT_TRUE(result.ok()) << result.status();
        for (int64_t r = 0; r < 2; ++r) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            const double x = query[r][c], y = key[c];
            s += score == kDot ? x * y : -(x - y) * (x - y) / 2.0;
          }
          const double expected = 0.5 * s + std::log(static_cast<double>(n));
          EXPECT_NEAR(result->log_sum_exp.data[r], expected,
                      1e-5 * (1.0 + std::fabs(expected)))
              << result->implementation << ", row " << r;
        }
      }
    }
  }
}

// A memory of n keys cut into pieces at `cuts`; each piece attended alone,
// asking for the log-sum-exp; the merge against the reference over all n.
struct PiecesCase {
  int64_t lq, n, d, dv;
  std::vector<int64_t> cuts;  // piece boundaries, ascending, inside (0, n)
  ScoreKind score;
  Precision precision;
  bool weights;
  std::string label;
};

std::string PiecesName(const ::testing::TestParamInfo<PiecesCase>& info) {
  return info.param.label;
}

class MergedPiecesTest : public ::testing::TestWithParam<PiecesCase> {};

TEST_P(MergedPiecesTest, EqualTheWholeMemory) {
  const PiecesCase& c = GetParam();
  std::mt19937 rng(4242 + c.n + c.lq);
  const Tensor q = RandomNormal(rng, {1, c.lq, c.d});
  Tensor k = RandomNormal(rng, {1, c.n, c.d});
  Tensor v = RandomNormal(rng, {1, c.n, c.dv});
  // In bfloat16 the pieces' calls read the keys and values as bits, as a
  // memory stored rounded holds them; the reference reads the same values
  // as floats.
  std::vector<uint16_t> key_bits, value_bits;
  if (c.precision == kBF16) {
    key_bits = RoundToBFloat16Bits(k);
    value_bits = RoundToBFloat16Bits(v);
  }
  AttentionRequest whole;
  whole.queries = q.view();
  whole.keys = k.view();
  whole.values = v.view();
  whole.score = c.score;
  whole.precision = c.precision;
  whole.return_weights = true;
  whole.return_log_sum_exp = true;
  auto exact = ReferenceEngine().ScaledDotProductAttention(whole);
  ASSERT_TRUE(exact.ok()) << exact.status();

  std::vector<int64_t> bounds_at = {0};
  bounds_at.insert(bounds_at.end(), c.cuts.begin(), c.cuts.end());
  bounds_at.push_back(c.n);
  std::vector<OpResult> answers;
  double piece_error = 0.0;
  for (size_t i = 0; i + 1 < bounds_at.size(); ++i) {
    const int64_t begin = bounds_at[i], rows = bounds_at[i + 1] - begin;
    AttentionRequest piece = whole;
    piece.keys = TensorView{k.data.data() + begin * c.d, {1, rows, c.d}};
    piece.values = TensorView{v.data.data() + begin * c.dv, {1, rows, c.dv}};
    // The piece's own bound on its log-sum-exp, from its own exact answer.
    auto piece_exact = ReferenceEngine().ScaledDotProductAttention(piece);
    ASSERT_TRUE(piece_exact.ok()) << piece_exact.status();
    piece_error = std::max(
        piece_error,
        LargestBound(AttentionBounds(piece, *piece_exact).log_sum_exp));
    piece.return_weights = c.weights;
    if (c.precision == kBF16) {
      piece.keys.data = piece.values.data = nullptr;
      piece.keys_bfloat16 = key_bits.data() + begin * c.d;
      piece.values_bfloat16 = value_bits.data() + begin * c.dv;
    }
    auto answer =
        OptimizedEngine(Threads::kAlwaysParallel).ScaledDotProductAttention(
            piece);
    ASSERT_TRUE(answer.ok()) << answer.status();
    answers.push_back(*std::move(answer));
  }
  std::vector<AttentionPiece> pieces;
  for (const OpResult& answer : answers) {
    pieces.push_back({answer.output.view(), answer.log_sum_exp.view(),
                      c.weights ? answer.weights.view() : TensorView{}});
  }
  auto merged = MergeAttentionPieces(pieces);
  ASSERT_TRUE(merged.ok()) << merged.status();

  const ErrorBounds bounds = AttentionBounds(whole, *exact, piece_error);
  EXPECT_TRUE(WithinBounds(merged->output, exact->output, bounds.output));
  EXPECT_TRUE(
      WithinBounds(merged->log_sum_exp, exact->log_sum_exp, bounds.log_sum_exp));
  if (c.weights) {
    EXPECT_TRUE(WithinBounds(merged->weights, exact->weights, bounds.weights));
  } else {
    EXPECT_TRUE(merged->weights.empty());
  }

  // Merged answers merge further, in any grouping (a replica's pieces first,
  // then the replicas'): the first two pieces, then the rest beside them.
  if (pieces.size() >= 3) {
    auto first = MergeAttentionPieces({pieces[0], pieces[1]});
    ASSERT_TRUE(first.ok()) << first.status();
    std::vector<AttentionPiece> regrouped = {
        {first->output.view(), first->log_sum_exp.view(),
         c.weights ? first->weights.view() : TensorView{}}};
    regrouped.insert(regrouped.end(), pieces.begin() + 2, pieces.end());
    auto again = MergeAttentionPieces(regrouped);
    ASSERT_TRUE(again.ok()) << again.status();
    // The first merge's L is rounded to float once more, and its weights
    // and output once more (attn/testing/error_bounds.h).
    const double grouped_error =
        piece_error +
        0x1p-24 * (LargestBound(first->log_sum_exp) + 2.0);
    const ErrorBounds regrouped_bounds =
        AttentionBounds(whole, *exact, grouped_error);
    EXPECT_TRUE(
        WithinBounds(again->output, exact->output, regrouped_bounds.output));
    if (c.weights) {
      EXPECT_TRUE(WithinBounds(again->weights, exact->weights,
                               regrouped_bounds.weights));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Memories, MergedPiecesTest,
    ::testing::Values(
        PiecesCase{4, 100, 8, 4, {}, kDot, kF32, true, "one_piece"},
        PiecesCase{4, 100, 8, 4, {1}, kDot, kF32, true, "a_piece_of_one"},
        PiecesCase{5, 700, 16, 8, {128, 300, 301, 512}, kDot, kF32, true,
                   "five_pieces"},
        PiecesCase{3, 500, 6, 5, {250}, kGauss, kF32, true, "gaussian"},
        PiecesCase{40, 3000, 64, 64, {1024, 2048}, kDot, kBF16, false,
                   "bfloat16"},
        // A base of many keys (its call shares them out among threads)
        // beside a few rows appended after it.
        PiecesCase{2, 10000, 64, 64, {8976, 9999}, kDot, kF32, false,
                   "base_and_appends"},
        PiecesCase{2, 10000, 64, 64, {8976}, kDot, kF32, true,
                   "base_and_appends_weights"}),
    PiecesName);

// A piece may hold no key for a row (its call's valid length 0 there): it
// adds nothing to that row; a row no piece has a key for is all zeros.
TEST(MergeAttentionPiecesTest, RowsWithoutKeysInAPiece) {
  std::mt19937 rng(9);
  const Tensor q = RandomNormal(rng, {2, 3, 4});
  const Tensor k = RandomNormal(rng, {2, 10, 4});
  const Tensor v = RandomNormal(rng, {2, 10, 3});
  AttentionRequest first;
  first.queries = q.view();
  first.keys = TensorView{k.data.data(), {2, 10, 4}};
  first.values = TensorView{v.data.data(), {2, 10, 3}};
  first.return_weights = true;
  first.return_log_sum_exp = true;
  // Batch entry 0 has no key in either piece; entry 1 only in the first.
  const std::vector<int32_t> first_lengths = {0, 10};
  const std::vector<int32_t> second_lengths = {0, 0};
  first.valid_lens = ViewOf(first_lengths, {2});
  AttentionRequest second = first;
  second.valid_lens = ViewOf(second_lengths, {2});
  auto a = OptimizedEngine(Threads::kDefault).ScaledDotProductAttention(first);
  auto b = OptimizedEngine(Threads::kDefault).ScaledDotProductAttention(second);
  ASSERT_TRUE(a.ok() && b.ok());
  auto merged = MergeAttentionPieces(
      {{a->output.view(), a->log_sum_exp.view(), a->weights.view()},
       {b->output.view(), b->log_sum_exp.view(), b->weights.view()}});
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_EQ(merged->weights.shape, (Shape{2, 3, 20}));
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(merged->log_sum_exp.data[r], kNegativeInfinity);
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(merged->output.data[r * 3 + c], 0.0f);
    }
    for (int64_t j = 0; j < 20; ++j) {
      EXPECT_EQ(merged->weights.data[r * 20 + j], 0.0f);
    }
    // Entry 1: the first piece's answer, and zero weight on the second's.
    const int64_t row = 3 + r;
    EXPECT_NEAR(merged->log_sum_exp.data[row], a->log_sum_exp.data[row],
                1e-6 * std::fabs(a->log_sum_exp.data[row]));
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_NEAR(merged->output.data[row * 3 + c],
                  a->output.data[row * 3 + c], 1e-6);
    }
    for (int64_t j = 0; j < 10; ++j) {
      EXPECT_NEAR(merged->weights.data[row * 20 + j],
                  a->weights.data[row * 10 + j], 1e-6);
      EXPECT_EQ(merged->weights.data[row * 20 + 10 + j], 0.0f);
    }
  }
}

TEST(MergeAttentionPiecesTest, RefusesPiecesThatDoNotFit) {
  const Tensor out = Tensor::Zeros({2, 3, 4});
  const Tensor other = Tensor::Zeros({2, 3, 5});
  const Tensor lse = Tensor::Zeros({2, 3});
  const Tensor short_lse = Tensor::Zeros({2, 2});
  const Tensor w = Tensor::Zeros({2, 3, 7});
  const Tensor bad_w = Tensor::Zeros({2, 4, 7});
  Tensor nan_lse = Tensor::Zeros({2, 3});
  nan_lse.data[4] = std::nanf("");
  Tensor inf_lse = Tensor::Zeros({2, 3});
  inf_lse.data[2] = std::numeric_limits<float>::infinity();
  const Tensor flat = Tensor::Zeros({4});
  const Tensor no_rows = Tensor::Zeros({});

  const AttentionPiece good{out.view(), lse.view(), {}};
  struct Refusal {
    std::vector<AttentionPiece> pieces;
    std::string names;
  };
  const std::vector<Refusal> refusals = {
      {{}, "pieces: none"},
      {{{flat.view(), no_rows.view(), {}}}, "pieces[0].output"},
      {{good, {other.view(), lse.view(), {}}}, "pieces[1].output"},
      {{good, {out.view(), short_lse.view(), {}}}, "pieces[1].log_sum_exp"},
      {{good, {out.view(), nan_lse.view(), {}}}, "pieces[1].log_sum_exp[4]"},
      {{{out.view(), inf_lse.view(), {}}}, "pieces[0].log_sum_exp[2]"},
      {{good, {out.view(), lse.view(), w.view()}}, "pieces[1].weights"},
      {{{out.view(), lse.view(), w.view()}, good}, "pieces[1].weights"},
      {{{out.view(), lse.view(), bad_w.view()}}, "pieces[0].weights"},
  };
  for (const Refusal& refusal : refusals) {
    auto merged = MergeAttentionPieces(refusal.pieces);
    ASSERT_FALSE(merged.ok()) << refusal.names;
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(merged.status().message().find(refusal.names), std::string::npos)
        << merged.status();
  }
}

// Merged weights past kMaxTensorElements are refused before anything is
// allocated or read: two pieces' weights views claim 2^30 + 1 keys each
// (their data, never read, is one float).
TEST(MergeAttentionPiecesTest, RefusesWeightsPastTheElementLimit) {
  const Tensor out = Tensor::Zeros({1, 1, 2});
  const Tensor lse = Tensor::Zeros({1, 1});
  const float never_read = 0.0f;
  const int64_t keys = (int64_t{1} << 30) + 1;
  const AttentionPiece piece{out.view(), lse.view(),
                             TensorView{&never_read, {1, 1, keys}}};
  auto merged = MergeAttentionPieces({piece, piece});
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kResourceExhausted)
      << merged.status();
  // One of them alone fits.
  const Tensor small = Tensor::Zeros({1, 1, 3});
  auto fits = MergeAttentionPieces(
      {{out.view(), lse.view(), small.view()},
       {out.view(), lse.view(), small.view()}});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->weights.shape, (Shape{1, 1, 6}));
}

}  // namespace
}  // namespace attn
