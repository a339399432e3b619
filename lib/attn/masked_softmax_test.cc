// The optimized masked softmax (oneDNN's softmax without lengths, the
// hand-vectorized rows with them) against the double-accumulating reference.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attn/engine.h"
#include "attn/ops.h"
#include "attn/reference.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/random.h"
#include "attn/validate.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AllClose;
using ::attn::testing::OptimizedEngine;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::Threads;
using ::attn::testing::AllExactly;
using ::attn::testing::RandomLengths;
using ::attn::testing::RandomNormal;
using ::attn::testing::ViewOf;

// Tolerance on a softmax weight p in [0, 1] against the double reference:
// |actual - expected| <= kWeightAbsTol + kWeightRelTol * p. Float32 exp is
// good to ~2 ulp (2.4e-7 relative), the float row sum of K <= 257 terms loses
// at most K * 2^-24 ~ 1.5e-5 relative in the worst case (~1e-6 typically),
// the reciprocal and the reference's final rounding one ulp each: about
// 1.6e-5 relative at worst, hence 2e-5. The absolute term covers weights
// near zero. (Measured on these seeds: at most 1 ulp, ~1.2e-7.)
constexpr double kWeightAbsTol = 1e-6;
constexpr double kWeightRelTol = 2e-5;
// |sum of a row - 1| for a row with at least one valid position.
constexpr double kRowSumTol = 1e-5;

// The reference engine (double accumulation) on the same request.
Tensor Reference(const MaskedSoftmaxRequest& request) {
  absl::StatusOr<OpResult> result = ReferenceEngine().MaskedSoftmax(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? std::move(result->output) : Tensor{};
}

// Runs the optimized engine, asserting it really was the optimized backend.
Tensor Optimized(const MaskedSoftmaxRequest& request, Threads threads) {
  absl::StatusOr<OpResult> result =
      OptimizedEngine(threads).MaskedSoftmax(request);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return Tensor{};
  // oneDNN's primitive without valid lengths, our prefix softmax with them.
  EXPECT_EQ(result->implementation, request.valid_lens.present()
                                        ? "cpu-masked-softmax"
                                        : "onednn-softmax");
  EXPECT_TRUE(result->weights.empty());
  return std::move(result->output);
}

// The number of valid columns of row (b, i) under `request`'s lengths.
int64_t Limit(const MaskedSoftmaxRequest& request, int64_t b, int64_t i) {
  const LengthsView& lens = request.valid_lens;
  const int64_t columns = request.x.shape[2];
  if (!lens.present()) return columns;
  if (lens.shape.size() == 1) return lens.data[b];
  return lens.data[b * request.x.shape[1] + i];
}

// Positions at or past each row's length are exactly 0; every row with a
// positive length sums to 1; every value is finite and in [0, 1].
void ExpectMaskedRows(const MaskedSoftmaxRequest& request, const Tensor& out) {
  const int64_t batch = request.x.shape[0];
  const int64_t rows = request.x.shape[1];
  const int64_t columns = request.x.shape[2];
  ASSERT_EQ(out.shape, request.x.shape);
  for (float value : out.data) {
    ASSERT_TRUE(std::isfinite(value) && value >= 0.0f && value <= 1.0f)
        << value;
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t offset = (b * rows + i) * columns;
      const int64_t limit = Limit(request, b, i);
      EXPECT_TRUE(AllExactly(out, 0.0f, offset + limit, offset + columns))
          << "row (" << b << ", " << i << "), length " << limit;
      if (limit == 0) continue;
      double sum = 0.0;
      for (int64_t j = 0; j < columns; ++j) sum += out.data[offset + j];
      EXPECT_NEAR(sum, 1.0, kRowSumTol)
          << "row (" << b << ", " << i << "), length " << limit;
    }
  }
}

enum class LengthsForm { kNone, kPerBatch, kPerRow };

std::string FormName(LengthsForm form) {
  switch (form) {
    case LengthsForm::kNone:
      return "NoLengths";
    case LengthsForm::kPerBatch:
      return "PerBatch";
    case LengthsForm::kPerRow:
      return "PerRow";
  }
  return "";
}

void PrintTo(LengthsForm form, std::ostream* os) { *os << FormName(form); }

// Random lengths in [0, columns], with the first forced to 0 and the last to
// `columns` (when there are at least two) so both extremes are always hit.
std::vector<int32_t> EdgeLengths(std::mt19937& rng, int64_t count,
                                 int64_t columns) {
  std::vector<int32_t> lengths =
      RandomLengths(rng, count, 0, static_cast<int32_t>(columns));
  if (count >= 2) {
    lengths.front() = 0;
    lengths.back() = static_cast<int32_t>(columns);
  }
  return lengths;
}

struct Dims {
  int64_t batch, rows, columns;
};

void PrintTo(const Dims& d, std::ostream* os) {
  *os << "(" << d.batch << ", " << d.rows << ", " << d.columns << ")";
}

using SweepParam = std::tuple<Dims, LengthsForm, Threads>;

class MaskedSoftmaxSweepTest : public ::testing::TestWithParam<SweepParam> {};

TEST_P(MaskedSoftmaxSweepTest, MatchesReference) {
  const auto& [dims, form, threads] = GetParam();
  std::mt19937 rng(1234 + 7 * dims.batch + 31 * dims.rows + dims.columns);
  const Tensor x = RandomNormal(rng, {dims.batch, dims.rows, dims.columns},
                                /*stddev=*/2.0f);
  std::vector<int32_t> lengths;
  MaskedSoftmaxRequest request{x.view(), {}};
  if (form == LengthsForm::kPerBatch) {
    lengths = EdgeLengths(rng, dims.batch, dims.columns);
    request.valid_lens = ViewOf(lengths, {dims.batch});
  } else if (form == LengthsForm::kPerRow) {
    lengths = EdgeLengths(rng, dims.batch * dims.rows, dims.columns);
    request.valid_lens = ViewOf(lengths, {dims.batch, dims.rows});
  }

  const Tensor expected = Reference(request);
  const Tensor actual = Optimized(request, threads);
  EXPECT_TRUE(AllClose(actual, expected, kWeightAbsTol, kWeightRelTol));
  ExpectMaskedRows(request, actual);
  // The oracle obeys the same invariants (so a wrong oracle cannot hide a
  // wrong kernel by agreeing with it).
  ExpectMaskedRows(request, expected);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MaskedSoftmaxSweepTest,
    ::testing::Combine(
        ::testing::Values(Dims{1, 1, 1}, Dims{7, 1, 1}, Dims{2, 5, 1},
                          Dims{1, 7, 97}, Dims{3, 4, 257}, Dims{2, 97, 7},
                          Dims{1, 257, 8}, Dims{4, 3, 17}, Dims{5, 9, 33},
                          Dims{2, 3, 64}),
        ::testing::Values(LengthsForm::kNone, LengthsForm::kPerBatch,
                          LengthsForm::kPerRow),
        ::testing::Values(Threads::kDefault, Threads::kAlwaysParallel)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      const Dims& d = std::get<0>(info.param);
      return absl::StrCat(
          d.batch, "x", d.rows, "x", d.columns, "_",
          FormName(std::get<1>(info.param)), "_",
          std::get<2>(info.param) == Threads::kDefault ? "Default"
                                                       : "Parallel");
    });

class MaskedSoftmaxEdgeTest : public ::testing::TestWithParam<Threads> {};

TEST_P(MaskedSoftmaxEdgeTest, ZeroLengthsGiveAllZeroRows) {
  std::mt19937 rng(42);
  const Tensor x = RandomNormal(rng, {3, 5, 97});
  const std::vector<int32_t> per_batch(3, 0);
  const std::vector<int32_t> per_row(15, 0);
  for (const MaskedSoftmaxRequest& request :
       {MaskedSoftmaxRequest{x.view(), ViewOf(per_batch, {3})},
        MaskedSoftmaxRequest{x.view(), ViewOf(per_row, {3, 5})}}) {
    const Tensor actual = Optimized(request, GetParam());
    ASSERT_EQ(actual.shape, x.shape);
    EXPECT_TRUE(AllExactly(actual, 0.0f, 0, 3 * 5 * 97));
    EXPECT_TRUE(AllExactly(Reference(request), 0.0f, 0, 3 * 5 * 97));
  }
}

TEST_P(MaskedSoftmaxEdgeTest, FullLengthsEqualNoLengths) {
  std::mt19937 rng(43);
  const Tensor x = RandomNormal(rng, {3, 7, 257});
  const std::vector<int32_t> per_batch(3, 257);
  const std::vector<int32_t> per_row(21, 257);
  const MaskedSoftmaxRequest none{x.view(), {}};
  const Tensor expected = Reference(none);
  const Tensor unmasked = Optimized(none, GetParam());
  EXPECT_TRUE(AllClose(unmasked, expected, kWeightAbsTol, kWeightRelTol));
  for (const MaskedSoftmaxRequest& request :
       {MaskedSoftmaxRequest{x.view(), ViewOf(per_batch, {3})},
        MaskedSoftmaxRequest{x.view(), ViewOf(per_row, {3, 7})}}) {
    const Tensor actual = Optimized(request, GetParam());
    EXPECT_TRUE(AllClose(actual, expected, kWeightAbsTol, kWeightRelTol));
    // The masked and unmasked kernels are different code; they must agree
    // with each other as well as with the reference.
    EXPECT_TRUE(AllClose(actual, unmasked, 2 * kWeightAbsTol, kWeightRelTol));
    ExpectMaskedRows(request, actual);
  }
}

// Hand-derived: softmax(0, ln 2, ln 3) = (1, 2, 3) / 6, and with length 2 it
// is (1, 2) / 3 followed by an exact zero; length 1 gives (1, 0, 0).
TEST_P(MaskedSoftmaxEdgeTest, HandDerivedSmallCase) {
  Tensor x = Tensor::Zeros({1, 3, 3});
  for (int64_t i = 0; i < 3; ++i) {
    x.data[i * 3 + 0] = 0.0f;
    x.data[i * 3 + 1] = std::log(2.0f);
    x.data[i * 3 + 2] = std::log(3.0f);
  }
  const std::vector<int32_t> lengths = {3, 2, 1};
  const MaskedSoftmaxRequest request{x.view(), ViewOf(lengths, {1, 3})};
  Tensor expected = Tensor::Zeros({1, 3, 3});
  expected.data = {1.0f / 6, 2.0f / 6, 3.0f / 6,  //
                   1.0f / 3, 2.0f / 3, 0.0f,      //
                   1.0f,     0.0f,     0.0f};
  const Tensor actual = Optimized(request, GetParam());
  EXPECT_TRUE(AllClose(actual, expected, 1e-6));
  EXPECT_TRUE(AllClose(Reference(request), expected, 1e-6));
  ExpectMaskedRows(request, actual);
}

// Softmax is shift invariant: rows of values around +-1e4 are fine as long as
// the maximum is subtracted first. A naive exp(x) overflows to inf and yields
// NaN.
TEST_P(MaskedSoftmaxEdgeTest, LargeMagnitudeInputsStayFinite) {
  std::mt19937 rng(44);
  const int64_t batch = 3, rows = 7, columns = 97;
  Tensor x = RandomNormal(rng, {batch, rows, columns});
  std::bernoulli_distribution sign(0.5);
  for (float& value : x.data) value += sign(rng) ? 1e4f : -1e4f;
  // Row 0 of batch 0 is constant +1e4 and row 1 constant -1e4: uniform
  // weights over the valid prefix.
  for (int64_t j = 0; j < columns; ++j) {
    x.data[j] = 1e4f;
    x.data[columns + j] = -1e4f;
  }
  std::vector<int32_t> lengths = EdgeLengths(rng, batch * rows, columns);
  lengths[0] = 10;
  lengths[1] = static_cast<int32_t>(columns);
  for (const MaskedSoftmaxRequest& request :
       {MaskedSoftmaxRequest{x.view(), {}},
        MaskedSoftmaxRequest{x.view(), ViewOf(lengths, {batch, rows})}}) {
    const Tensor actual = Optimized(request, GetParam());
    ExpectMaskedRows(request, actual);  // checks finiteness too
    EXPECT_TRUE(AllClose(actual, Reference(request), kWeightAbsTol, kWeightRelTol));
    const int64_t first = Limit(request, 0, 0);
    const int64_t second = Limit(request, 0, 1);
    for (int64_t j = 0; j < first; ++j) {
      EXPECT_NEAR(actual.data[j], 1.0 / first, kWeightAbsTol);
    }
    for (int64_t j = 0; j < second; ++j) {
      EXPECT_NEAR(actual.data[columns + j], 1.0 / second, kWeightAbsTol);
    }
  }
}

// Much larger finite magnitudes (differences of ~2e30 within a row) must
// still give finite weights: every exp argument is <= 0 after the shift.
TEST_P(MaskedSoftmaxEdgeTest, HugeFiniteInputsStayFinite) {
  std::mt19937 rng(45);
  Tensor x = RandomNormal(rng, {2, 3, 33});
  for (float& value : x.data) value *= 1e30f;
  const std::vector<int32_t> lengths = {33, 1, 0, 17, 5, 32};
  for (const MaskedSoftmaxRequest& request :
       {MaskedSoftmaxRequest{x.view(), {}},
        MaskedSoftmaxRequest{x.view(), ViewOf(lengths, {2, 3})}}) {
    const Tensor actual = Optimized(request, GetParam());
    ExpectMaskedRows(request, actual);
    EXPECT_TRUE(AllClose(actual, Reference(request), kWeightAbsTol, kWeightRelTol));
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, MaskedSoftmaxEdgeTest,
                         ::testing::Values(Threads::kDefault,
                                           Threads::kAlwaysParallel),
                         [](const ::testing::TestParamInfo<Threads>& info) {
                           return info.param == Threads::kDefault
                                      ? "Default"
                                      : "Parallel";
                         });

// A reference-only engine runs the same kernel the tests use as the oracle,
// and must say so.
TEST(MaskedSoftmaxEngineTest, ReferenceEngineReportsReference) {
  EngineOptions options;
  options.use_onednn = false;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->backend_names(), std::vector<std::string>{"reference"});
  std::mt19937 rng(46);
  const Tensor x = RandomNormal(rng, {2, 3, 7});
  absl::StatusOr<OpResult> result =
      (*engine)->MaskedSoftmax(MaskedSoftmaxRequest{x.view(), {}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->implementation, "reference");
  EXPECT_TRUE(AllClose(result->output,
                       Reference(MaskedSoftmaxRequest{x.view(), {}}), 0.0));
  EXPECT_EQ(OptimizedEngine(Threads::kDefault).backend_names(),
            (std::vector<std::string>{"onednn-cpu", "reference"}));
}

}  // namespace
}  // namespace attn
