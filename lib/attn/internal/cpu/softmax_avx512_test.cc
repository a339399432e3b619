// The avx512 copy's softmax arithmetic (attn/internal/cpu/softmax_avx512.h)
// against double-precision libm at the accuracy attn/testing/error_bounds.h
// assumes of the kernels' exp (4 float ulp), with vec_math.h's edges
// (exactly 0 below -87 and for -inf, NaN kept), and its row helpers against
// plain loops in double. Compiled as the avx512 copy; skipped as such on a
// CPU without AVX-512.
// (GCC 12's unmasked AVX-512 intrinsics: see softmax_avx512.h's users.)
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attn/cpu_isa.h"
#include "attn/internal/isa.h"
#include "gtest/gtest.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/softmax_avx512.h"

namespace attn::internal::avx512 {
namespace {

// of64 of every element of `args`, 64 at a time, and of16 of the rest
// (ExpOf64 and ExpOf16, or Exp2Of64 and Exp2Of16).
std::vector<float> EachOf(const std::vector<float>& args,
                          void (*of64)(__m512 (&)[4]),
                          __m512 (*of16)(__m512)) {
  std::vector<float> out(args.size());
  size_t i = 0;
  for (; i + 64 <= args.size(); i += 64) {
    __m512 x[4];
    for (int w = 0; w < 4; ++w) x[w] = _mm512_loadu_ps(&args[i + 16 * w]);
    of64(x);
    for (int w = 0; w < 4; ++w) _mm512_storeu_ps(&out[i + 16 * w], x[w]);
  }
  for (; i < args.size(); ++i) {
    float lane[16] = {args[i]};
    _mm512_storeu_ps(lane, of16(_mm512_loadu_ps(lane)));
    out[i] = lane[0];
  }
  return out;
}

std::vector<float> ExpOfEach(const std::vector<float>& args) {
  return EachOf(args, ExpOf64, ExpOf16);
}
std::vector<float> Exp2OfEach(const std::vector<float>& args) {
  return EachOf(args, Exp2Of64, Exp2Of16);
}

float RowMaxOf(const std::vector<float>& row, float init) {
  return RowMax(row.data(), static_cast<int64_t>(row.size()), init);
}

float ExpShiftedAndSumOf(std::vector<float>& row, float max, float scale) {
  return ExpShiftedAndSumInPlace(row.data(), static_cast<int64_t>(row.size()),
                                 max, scale);
}

}  // namespace
}  // namespace attn::internal::avx512
ATTN_ISA_END

namespace attn::internal::avx512 {
namespace {

constexpr double kU = 0x1p-24;

bool HasAvx512() { return DetectCpuIsa() >= CpuIsa::kAvx512; }

// The worst relative error of `each` (ExpOfEach or Exp2OfEach) against
// `exact` in double over steps + 1 evenly spaced floats in [lo, hi].
double WorstRelativeError(
    std::vector<float> (*each)(const std::vector<float>&),
    double (*exact)(double), double lo, double hi, int steps) {
  std::vector<float> args(steps + 1);
  for (int i = 0; i <= steps; ++i) {
    args[i] = static_cast<float>(lo + (hi - lo) * i / steps);
  }
  const std::vector<float> values = each(args);
  double worst = 0.0;
  for (size_t i = 0; i < args.size(); ++i) {
    const double want = exact(static_cast<double>(args[i]));
    worst = std::max(worst, std::fabs(values[i] - want) / want);
  }
  return worst;
}

TEST(SoftmaxAvx512Test, ExpWithinFourUlp) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  // Evenly spaced over the sweeps' range, and densely near 0, where their
  // largest weights are; 64 and 63 at a time so that both paths run.
  for (const auto& [lo, hi] : {std::pair{-87.0, 0.0}, std::pair{-1.0, 0.0}}) {
    for (const int steps : {2'000'063, 999'999}) {
      const double worst =
          WorstRelativeError(ExpOfEach, std::exp, lo, hi, steps);
      EXPECT_LE(worst, 4 * kU) << "[" << lo << ", " << hi << "]";
    }
  }
}

TEST(SoftmaxAvx512Test, UnderflowIsExactlyZeroAndNaNPropagates) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // The edges first in a run of 64 (ExpOf64), then alone (ExpOf16).
  const std::vector<float> edges = {-87.5f, -100.0f, -1e30f, -inf, 0.0f, nan};
  std::vector<float> args = edges;
  args.resize(64, -inf);
  args.insert(args.end(), edges.begin(), edges.end());
  const std::vector<float> exps = ExpOfEach(args);
  for (const size_t base : {size_t{0}, size_t{64}}) {
    SCOPED_TRACE(base == 0 ? "ExpOf64" : "ExpOf16");
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(exps[base + i], 0.0f) << i;
    EXPECT_EQ(exps[base + 4], 1.0f);
    // inf - inf in a sweep: the engine must see NaN to redo the call.
    EXPECT_TRUE(std::isnan(exps[base + 5]));
  }
}

// The bfloat16-grade 2^t within its stated error over its whole range
// (the kernels' arguments reach 8 * log2(e) above 0 with lazy rescaling),
// densely around 0 and the fractions' ends (+-1/2, where the polynomial's
// error peaks).
TEST(SoftmaxAvx512Test, Exp2ForBFloat16WithinItsError) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const auto& [lo, hi] :
       {std::pair{-125.5, 12.0}, std::pair{-1.0, 1.0}, std::pair{-3.6, -3.4}}) {
    for (const int steps : {2'000'063, 999'999}) {
      const double worst =
          WorstRelativeError(Exp2OfEach, std::exp2, lo, hi, steps);
      EXPECT_LE(worst, kExp2ForBFloat16Error)
          << "[" << lo << ", " << hi << "]";
      // Tight enough to be worth its 11 instructions: a degree-3 fit would
      // be 7.5e-5 off.
      EXPECT_GE(worst, kExp2ForBFloat16Error / 4)
          << "[" << lo << ", " << hi << "]";
    }
  }
}

TEST(SoftmaxAvx512Test, Exp2ForBFloat16Edges) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // The edges first in a run of 64 (Exp2Of64), then alone (Exp2Of16).
  const std::vector<float> edges = {-126.0f, -1e30f, -inf, 0.0f, nan, 200.0f};
  std::vector<float> args = edges;
  args.resize(64, 0.0f);
  args.insert(args.end(), edges.begin(), edges.end());
  const std::vector<float> exps = Exp2OfEach(args);
  const double floor = std::exp2(-125.5);
  for (const size_t base : {size_t{0}, size_t{64}}) {
    SCOPED_TRACE(base == 0 ? "Exp2Of64" : "Exp2Of16");
    for (size_t i = 0; i < 3; ++i) {
      // Clamped to 2^-125.5: normal, under the bounds' flush floor.
      EXPECT_EQ(std::fpclassify(exps[base + i]), FP_NORMAL) << i;
      EXPECT_NEAR(exps[base + i], floor, floor * kExp2ForBFloat16Error) << i;
    }
    EXPECT_NEAR(exps[base + 3], 1.0f, kExp2ForBFloat16Error);
    EXPECT_TRUE(std::isnan(exps[base + 4]));
    EXPECT_EQ(exps[base + 5], inf);
  }
}

// The row helpers on rows of every length around the 16- and 64-float
// steps: the max exactly, the exponentials and their sum within the bound's
// terms of a plain double loop.
TEST(SoftmaxAvx512Test, RowMaxAndExponentialsMatchPlainLoops) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const int length : {1, 15, 16, 17, 63, 64, 65, 100, 256, 257}) {
    SCOPED_TRACE(::testing::Message() << "length " << length);
    std::vector<float> row(length);
    for (float& x : row) x = normal(rng);
    const float max = *std::max_element(row.begin(), row.end());
    EXPECT_EQ(RowMaxOf(row, -std::numeric_limits<float>::infinity()), max);
    EXPECT_EQ(RowMaxOf(row, max + 1.0f), max + 1.0f);
    const float scale = 0.7f;
    std::vector<double> exact(length);
    double exact_sum = 0.0;
    for (int i = 0; i < length; ++i) {
      exact[i] = std::exp((static_cast<double>(row[i]) - max) * scale);
      exact_sum += exact[i];
    }
    const float sum = ExpShiftedAndSumOf(row, max, scale);
    for (int i = 0; i < length; ++i) {
      // The argument rounded twice (difference, product) plus 4 ulp of exp,
      // relative to |x - max| * scale.
      const double argument = std::fabs(exact[i] == 0 ? 0 : std::log(exact[i]));
      EXPECT_NEAR(row[i], exact[i], exact[i] * (4 * kU + 3 * kU * argument))
          << i;
    }
    EXPECT_NEAR(sum, exact_sum, exact_sum * (length + 8) * kU * 4);
  }
}

}  // namespace
}  // namespace attn::internal::avx512
