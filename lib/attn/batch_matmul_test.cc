// The optimized batch matmul (oneDNN) against the double-accumulating
// reference, in float32 and bfloat16 precision.
//
// Tolerances are per element, computed from the operands (u32 = 2^-24, the
// float32 unit roundoff; c = the exact value; S1 = sum_l |a_l b_l|;
// S2 = sqrt(sum_l (a_l b_l)^2); for unit normals S1 ~ 0.64 k, S2 ~ sqrt(k)):
//
// - Same precision (fp32 vs fp32 reference, or bf16 vs bf16 reference: the
//   product of two bfloat16 values is exact in float32, so the bf16 path
//   differs from the fp32 one only in its operands): float32 accumulation of
//   k terms. The probabilistic rounding-error bound (Higham & Mary 2019) is
//   lambda * u32 * sqrt(k) * S1 with a small lambda; we take lambda = 4, plus
//   one rounding of the result on each side (2 * u32 * |c|). The worst seen
//   on these seeds is ~0.6 of u32 * (sqrt(k) S1 + |c|).
// - bf16 vs the fp32 reference: bfloat16 keeps 8 significant bits (7 stored,
//   1 implicit), so rounding an operand changes it by a relative error of at
//   most u16 = 2^-8 (std ~0.41 u16 for a uniform mantissa), and a product by
//   at most 2^-7 + 2^-16. Summed over k products these errors are independent,
//   so their sum has std ~0.58 u16 * S2. We allow 4 * u16 * S2 (about 7
//   standard deviations; for k = 1 it is a hard bound since |error| <=
//   (2^-7 + 2^-16) |ab| < 4 * 2^-8 |ab|), plus the fp32 term above. For unit
//   normals this is the familiar 4 * 2^-8 * sqrt(k). The worst seen on these
//   seeds is ~2.5 u16 * S2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attn/bfloat16.h"
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
using ::attn::testing::RandomNormal;

constexpr double kU32 = 1.0 / (1 << 24);  // 2^-24
constexpr double kU16 = 1.0 / (1 << 8);   // 2^-8
constexpr double kAccumulationLambda = 4.0;
constexpr double kBf16Lambda = 4.0;


Tensor Reference(const BatchMatmulRequest& request) {
  absl::StatusOr<OpResult> result = ReferenceEngine().BatchMatmul(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? std::move(result->output) : Tensor{};
}

Tensor Optimized(const BatchMatmulRequest& request, Threads threads) {
  absl::StatusOr<OpResult> result =
      OptimizedEngine(threads).BatchMatmul(request);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return Tensor{};
  EXPECT_EQ(result->implementation, "onednn-matmul");
  EXPECT_TRUE(result->weights.empty());
  return std::move(result->output);
}

// Per output element: S1 = sum |a_l b_l| and S2 = sqrt(sum (a_l b_l)^2).
struct Magnitudes {
  std::vector<double> s1, s2;
};

Magnitudes ProductMagnitudes(const Tensor& a, const Tensor& b) {
  const int64_t n = a.shape[0], m = a.shape[1], k = a.shape[2];
  const int64_t p = b.shape[2];
  Magnitudes mags;
  mags.s1.assign(n * m * p, 0.0);
  mags.s2.assign(n * m * p, 0.0);
  for (int64_t bb = 0; bb < n; ++bb) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < p; ++j) {
        double s1 = 0.0, s2 = 0.0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = static_cast<double>(a.data[(bb * m + i) * k + l]) *
                           b.data[(bb * k + l) * p + j];
          s1 += std::fabs(x);
          s2 += x * x;
        }
        mags.s1[(bb * m + i) * p + j] = s1;
        mags.s2[(bb * m + i) * p + j] = std::sqrt(s2);
      }
    }
  }
  return mags;
}

// The same-precision bound of the header comment.
double AccumulationBound(double s1, double expected, int64_t k) {
  return kAccumulationLambda * kU32 * std::sqrt(static_cast<double>(k)) * s1 +
         2.0 * kU32 * std::fabs(expected);
}

// Passes when |actual[i] - expected[i]| <= bound[i] for every element (and
// actual is finite); names the worst element by its error / bound ratio.
::testing::AssertionResult WithinBounds(const Tensor& actual,
                                        const Tensor& expected,
                                        const std::vector<double>& bound) {
  if (actual.shape != expected.shape) {
    return ::testing::AssertionFailure()
           << "shape " << ShapeToString(actual.shape) << " != expected "
           << ShapeToString(expected.shape);
  }
  double worst_ratio = 0.0;
  int64_t worst = -1;
  for (size_t i = 0; i < actual.data.size(); ++i) {
    const double a = actual.data[i];
    const double error =
        std::isfinite(a) ? std::fabs(a - expected.data[i]) : INFINITY;
    const double ratio = bound[i] > 0.0 ? error / bound[i]
                                        : (error > 0.0 ? INFINITY : 0.0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
  }
  if (worst_ratio > 1.0) {
    return ::testing::AssertionFailure()
           << "element " << worst << " of " << ShapeToString(actual.shape)
           << ": got " << actual.data[worst] << ", expected "
           << expected.data[worst] << ", error "
           << std::fabs(actual.data[worst] - expected.data[worst])
           << " > bound " << bound[worst] << " (ratio " << worst_ratio << ")";
  }
  return ::testing::AssertionSuccess();
}

struct Dims {
  int64_t n, m, k, p;
};

std::string DimsName(const Dims& d) {
  return absl::StrCat(d.n, "x", d.m, "x", d.k, "x", d.p);
}

void PrintTo(const Dims& d, std::ostream* os) {
  *os << "n=" << d.n << " m=" << d.m << " k=" << d.k << " p=" << d.p;
}

using SweepParam = std::tuple<Dims, Threads>;

class BatchMatmulSweepTest : public ::testing::TestWithParam<SweepParam> {
 protected:
  void SetUp() override {
    const Dims& d = std::get<0>(GetParam());
    std::mt19937 rng(2024 + 1000 * d.n + 100 * d.m + 10 * d.k + d.p);
    a_ = RandomNormal(rng, {d.n, d.m, d.k});
    b_ = RandomNormal(rng, {d.n, d.k, d.p});
    mags_ = ProductMagnitudes(a_, b_);
  }

  Tensor a_, b_;
  Magnitudes mags_;
};

TEST_P(BatchMatmulSweepTest, Float32MatchesReference) {
  const auto& [d, threads] = GetParam();
  const BatchMatmulRequest request{a_.view(), b_.view(), Precision::kFloat32};
  const Tensor expected = Reference(request);
  const Tensor actual = Optimized(request, threads);
  ASSERT_EQ(actual.shape, (Shape{d.n, d.m, d.p}));
  std::vector<double> bound(expected.data.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    bound[i] = AccumulationBound(mags_.s1[i], expected.data[i], d.k);
  }
  EXPECT_TRUE(WithinBounds(actual, expected, bound));
}

TEST_P(BatchMatmulSweepTest, BFloat16MatchesBFloat16Reference) {
  const auto& [d, threads] = GetParam();
  const BatchMatmulRequest request{a_.view(), b_.view(), Precision::kBFloat16};
  const Tensor expected = Reference(request);
  const Tensor actual = Optimized(request, threads);
  ASSERT_EQ(actual.shape, (Shape{d.n, d.m, d.p}));
  // Both sides use the same rounded operands; only the accumulation differs.
  std::vector<double> bound(expected.data.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    bound[i] = AccumulationBound(mags_.s1[i], expected.data[i], d.k);
  }
  EXPECT_TRUE(WithinBounds(actual, expected, bound));
}

TEST_P(BatchMatmulSweepTest, BFloat16IsWithinItsBoundOfFloat32Reference) {
  const auto& [d, threads] = GetParam();
  const Tensor expected = Reference(
      BatchMatmulRequest{a_.view(), b_.view(), Precision::kFloat32});
  const Tensor actual = Optimized(
      BatchMatmulRequest{a_.view(), b_.view(), Precision::kBFloat16}, threads);
  std::vector<double> bound(expected.data.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    bound[i] = kBf16Lambda * kU16 * mags_.s2[i] +
               AccumulationBound(mags_.s1[i], expected.data[i], d.k);
  }
  EXPECT_TRUE(WithinBounds(actual, expected, bound));
  // And the precision flag is not ignored: random normals are not bfloat16
  // values, so the bf16 result must differ from the fp32 reference somewhere
  // by more than fp32 accumulation error could explain.
  bool differs = false;
  for (size_t i = 0; i < expected.data.size() && !differs; ++i) {
    differs = std::fabs(actual.data[i] - expected.data[i]) >
              AccumulationBound(mags_.s1[i], expected.data[i], d.k);
  }
  EXPECT_TRUE(differs) << "bf16 result indistinguishable from fp32";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BatchMatmulSweepTest,
    ::testing::Combine(
        ::testing::Values(Dims{1, 1, 1, 1}, Dims{7, 1, 1, 1},
                          Dims{2, 7, 257, 5}, Dims{3, 257, 7, 1},
                          Dims{1, 1, 97, 257}, Dims{7, 97, 1, 7},
                          Dims{1, 7, 7, 97}, Dims{2, 16, 33, 17},
                          Dims{1, 64, 64, 64}, Dims{4, 97, 64, 97}),
        ::testing::Values(Threads::kDefault, Threads::kAlwaysParallel)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      return absl::StrCat(DimsName(std::get<0>(info.param)), "_",
                          std::get<1>(info.param) == Threads::kDefault
                              ? "Default"
                              : "Parallel");
    });

// Hand-derived: [[1, 2], [3, 4]] x [[5, 6], [7, 8]] = [[19, 22], [43, 50]],
// and a second batch entry with the identity on the right returns its left
// operand. All values are small integers: exact in float32 and in bfloat16.
TEST(BatchMatmulTest, HandDerivedSmallCase) {
  Tensor a = Tensor::Zeros({2, 2, 2});
  Tensor b = Tensor::Zeros({2, 2, 2});
  a.data = {1, 2, 3, 4, -3, 0.5f, 8, -1};
  b.data = {5, 6, 7, 8, 1, 0, 0, 1};
  Tensor expected = Tensor::Zeros({2, 2, 2});
  expected.data = {19, 22, 43, 50, -3, 0.5f, 8, -1};
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    const BatchMatmulRequest request{a.view(), b.view(), precision};
    EXPECT_TRUE(AllClose(Optimized(request, Threads::kDefault), expected, 0.0))
        << PrecisionName(precision);
    EXPECT_TRUE(AllClose(Reference(request), expected, 0.0))
        << PrecisionName(precision);
  }
}

// Hand-derived bfloat16 rounding: bfloat16 has 8 significant bits, so the
// spacing at 1 is 2^-7. 1 + 2^-10 rounds down to 1 and 1 + 3 * 2^-9 (0.75 of
// a spacing) rounds up to 1 + 2^-7. With a = 1 + 2^-10 and b = 1 + 3 * 2^-9
// over k = 8 terms the bf16 product is 8 * (1 + 2^-7) = 8.0625 exactly, while
// float32 gives 8 * (1 + 2^-10)(1 + 3 * 2^-9) (exact: 17 bits of mantissa).
TEST(BatchMatmulTest, BFloat16RoundsOperandsToNearest) {
  const float a_value = 1.0f + std::ldexp(1.0f, -10);
  const float b_value = 1.0f + 3.0f * std::ldexp(1.0f, -9);
  ASSERT_EQ(RoundToBFloat16(a_value), 1.0f);
  ASSERT_EQ(RoundToBFloat16(b_value), 1.0f + std::ldexp(1.0f, -7));
  Tensor a = Tensor::Zeros({1, 1, 8});
  Tensor b = Tensor::Zeros({1, 8, 1});
  std::fill(a.data.begin(), a.data.end(), a_value);
  std::fill(b.data.begin(), b.data.end(), b_value);
  Tensor bf16_expected = Tensor::Zeros({1, 1, 1});
  bf16_expected.data = {8.0625f};
  Tensor fp32_expected = Tensor::Zeros({1, 1, 1});
  fp32_expected.data = {static_cast<float>(8.0 * a_value * b_value)};
  ASSERT_NE(bf16_expected.data[0], fp32_expected.data[0]);
  for (Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
    EXPECT_TRUE(AllClose(
        Optimized(BatchMatmulRequest{a.view(), b.view(), Precision::kBFloat16},
                  threads),
        bf16_expected, 0.0));
    EXPECT_TRUE(AllClose(
        Optimized(BatchMatmulRequest{a.view(), b.view(), Precision::kFloat32},
                  threads),
        fp32_expected, 0.0));
  }
  EXPECT_TRUE(AllClose(
      Reference(BatchMatmulRequest{a.view(), b.view(), Precision::kBFloat16}),
      bf16_expected, 0.0));
}

// The optimized backend must not modify its inputs (the bf16 path rounds a
// copy, not the caller's data).
TEST(BatchMatmulTest, InputsAreUnchanged) {
  std::mt19937 rng(7);
  const Tensor a = RandomNormal(rng, {2, 7, 97});
  const Tensor b = RandomNormal(rng, {2, 97, 5});
  Tensor a_copy = a, b_copy = b;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    Optimized(BatchMatmulRequest{a_copy.view(), b_copy.view(), precision},
              Threads::kDefault);
    EXPECT_TRUE(AllClose(a_copy, a, 0.0)) << PrecisionName(precision);
    EXPECT_TRUE(AllClose(b_copy, b, 0.0)) << PrecisionName(precision);
  }
}

// Repeating a shape reuses the cached oneDNN primitive; the result must be
// for the new data, not a stale one.
TEST(BatchMatmulTest, RepeatedShapeUsesNewData) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 3; ++trial) {
    const Tensor a = RandomNormal(rng, {3, 5, 7});
    const Tensor b = RandomNormal(rng, {3, 7, 9});
    const BatchMatmulRequest request{a.view(), b.view(), Precision::kFloat32};
    const Tensor expected = Reference(request);
    const Magnitudes mags = ProductMagnitudes(a, b);
    std::vector<double> bound(expected.data.size());
    for (size_t i = 0; i < bound.size(); ++i) {
      bound[i] = AccumulationBound(mags.s1[i], expected.data[i], 7);
    }
    EXPECT_TRUE(
        WithinBounds(Optimized(request, Threads::kDefault), expected, bound))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace attn
