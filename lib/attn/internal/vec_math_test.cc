// The kernels' fast math (attn/internal/vec_math.h) against double-precision
// libm, at the accuracy attn/testing/error_bounds.h assumes of it: exp to 4
// float ulp (u = 2^-24 relative), tanh to 8u absolute, bfloat16 rounding to
// nearest with ties to even. Compiled as the baseline copy; the other copies
// are the same source under another target (their results are checked end
// to end by every kernel test under the ISA variants).
#define ATTN_ISA_BASELINE 1
#include "attn/internal/vec_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "attn/bfloat16.h"
#include "gtest/gtest.h"

namespace attn::internal::baseline {
namespace {

constexpr double kU = 0x1p-24;

// Worst relative error of `exp` against std::exp over [lo, hi] in `steps`
// evenly spaced floats.
template <typename Exp>
double WorstRelativeError(const Exp& exp, double lo, double hi, int steps) {
  double worst = 0.0;
  for (int i = 0; i <= steps; ++i) {
    const float x = static_cast<float>(lo + (hi - lo) * i / steps);
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp(x) - exact) / exact);
  }
  return worst;
}

TEST(VecMathTest, ExpWithinFourUlp) {
  EXPECT_LE(WorstRelativeError(FastExp, -87.0, 88.0, 2'000'000), 4 * kU);
  EXPECT_LE(WorstRelativeError(ExpOfNonPositive, -87.0, 0.0, 2'000'000),
            4 * kU);
  // Near zero, where the sweeps' largest weights are.
  EXPECT_LE(WorstRelativeError(ExpOfNonPositive, -1.0, 0.0, 1'000'000), 4 * kU);
}

TEST(VecMathTest, ExpUnderflowIsExactlyZeroAndNaNPropagates) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {-87.5f, -100.0f, -1e30f, -inf}) {
    EXPECT_EQ(FastExp(x), 0.0f) << x;
    EXPECT_EQ(ExpOfNonPositive(x), 0.0f) << x;
  }
  EXPECT_EQ(ExpOfNonPositive(0.0f), 1.0f);
  EXPECT_EQ(FastExp(0.0f), 1.0f);
  // inf - inf in a sweep: the engine must see NaN to redo the call.
  EXPECT_TRUE(std::isnan(ExpOfNonPositive(nan)));
  EXPECT_TRUE(std::isnan(FastExp(nan)));
}

TEST(VecMathTest, TanhWithinEightUlpAbsolute) {
  double worst = 0.0;
  for (int i = 0; i <= 4'000'000; ++i) {
    const float x = static_cast<float>(-12.0 + 24.0 * i / 4'000'000);
    worst = std::max(worst, std::fabs(FastTanh(x) - std::tanh(double{x})));
  }
  EXPECT_LE(worst, 8 * kU);
  EXPECT_EQ(FastTanh(0.0f), 0.0f);
  EXPECT_EQ(FastTanh(100.0f), 1.0f);
  EXPECT_EQ(FastTanh(-100.0f), -1.0f);
}

TEST(VecMathTest, BFloat16RoundsToNearestEven) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  while (checked < 1'000'000) {
    uint32_t b = bits(rng);
    float x;
    std::memcpy(&x, &b, sizeof(x));
    const float rounded = RoundToBFloat16(x);  // the reference rounding
    if (!std::isfinite(x) || !std::isfinite(rounded)) continue;
    ASSERT_EQ(FromBFloat16(ToBFloat16(x)), rounded) << x;
    ++checked;
  }
  // Ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and goes to even (1);
  // 1 + 3 * 2^-8 goes up to 1 + 2^-6.
  EXPECT_EQ(FromBFloat16(ToBFloat16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(FromBFloat16(ToBFloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  float row[40], exps[40];
  uint16_t rounded[40];
  for (int i = 0; i < 40; ++i) row[i] = exps[i] = -0.25f * i;
  const float sum = ExpShiftedSumAndRound(row, 40, 0.0f, 2.0f, rounded);
  const float expected_sum = ExpShiftedAndSum(exps, 40, 0.0f, 2.0f);
  // The same terms, summed in whatever order each loop vectorizes to.
  EXPECT_NEAR(sum, expected_sum, 40 * kU * expected_sum);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(FromBFloat16(rounded[i]), RoundToBFloat16(exps[i])) << i;
  }
}

// The kernels' own range check as they round: exactly the floats that
// bfloat16.h's reference rounding takes from finite to infinite, each found
// alone at every position of a run (the vector loop's lanes and its tail),
// and the rounding the same as ToBFloat16's.
TEST(VecMathTest, BFloat16PastRangeIsExactlyFiniteToInfinite) {
  const float inf = std::numeric_limits<float>::infinity();
  auto from_bits = [](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    return x;
  };
  for (const float x :
       {from_bits(0x7f7f7fff), from_bits(0x7f7f8000), from_bits(0x7f7fffff),
        from_bits(0xff7f7fff), from_bits(0xff7f8000), 3.3e38f, 3.4e38f,
        -3.4e38f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1.0f}) {
    const bool past = std::isfinite(x) && std::isinf(RoundToBFloat16(x));
    for (const int at : {0, 5, 16, 36}) {
      float run[37];
      for (int i = 0; i < 37; ++i) run[i] = 0.5f * i - 3.0f;
      run[at] = x;
      uint16_t rounded[37];
      EXPECT_EQ(ToBFloat16PastRange(run, 37, rounded), past)
          << x << " at " << at;
      for (int i = 0; i < 37; ++i) {
        if (std::isnan(run[i])) continue;
        EXPECT_EQ(rounded[i], ToBFloat16(run[i])) << i;
      }
    }
  }
}

// The kernels' own overflow scan of their output as they write it: false
// for exactly the rows holding an infinity or NaN, at any lane, including
// a finite value scaled past float's range; the values written are the
// products either way.
TEST(VecMathTest, ScaleIntoFiniteFindsEveryNonFiniteValue) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float bad : {inf, -inf, nan, 3e38f}) {
    for (const int at : {-1, 0, 7, 16, 36}) {
      float row[37], out[37];
      for (int i = 0; i < 37; ++i) row[i] = 0.25f * i - 4.0f;
      if (at >= 0) row[at] = bad;
      const bool finite = ScaleIntoFinite(row, 37, 2.0f, out);
      EXPECT_EQ(finite, at < 0) << bad << " at " << at;
      for (int i = 0; i < 37; ++i) {
        if (!std::isnan(row[i])) EXPECT_EQ(out[i], row[i] * 2.0f) << i;
      }
    }
  }
}

}  // namespace
}  // namespace attn::internal::baseline
