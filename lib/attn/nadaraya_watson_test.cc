// The optimized Nadaraya-Watson kernels (gaussian, boxcar, constant,
// epanechnikov) against the double-accumulating reference.
//
// Tolerances are per element, derived from the data (u32 = 2^-24):
// - Gaussian: the kernel computes the score s_j = -w^2 d_j^2 / 2 in float32:
//   d^2 over dx coordinates carries (dx + 1) roundings and w^2, the factor and
//   the product three more, so |ds_j| <= (dx + 4) u32 |s_j|. A softmax weight
//   then moves by p_j (|ds_j| + sum_l p_l |ds_l|) to first order, plus the
//   float softmax's own error (2e-5 relative, as in masked_softmax_test).
// - Boxcar, constant: kernel values are exactly 0 or 1 (a point within float
//   rounding of the boundary u = 1 could flip, which random data never hits),
//   so only the normalisation rounds: 2e-5 relative.
// - Epanechnikov: u = w * sqrt(d^2) carries about (dx + 3) u32 relative
//   error, so each kernel value K = 1 - u (u < 1) is off by dk <= (dx + 3) u32
//   absolutely. A weight K_j / M moves by at most dk (1 + N p_j) / M, where M
//   is the row's kernel mass and N the number of points inside the kernel.
// - Output: sum_j |dp_j| |y_j| over the weight bounds above, plus 2e-5
//   relative accumulation error and 1e-6 absolute.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
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

constexpr double kU32 = 1.0 / (1 << 24);
constexpr double kSoftmaxRelTol = 2e-5;
constexpr double kAbsTol = 1e-6;
constexpr double kRowSumTol = 1e-5;


OpResult Reference(const NadarayaWatsonRequest& request) {
  absl::StatusOr<OpResult> result = ReferenceEngine().NadarayaWatson(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : OpResult{};
}

OpResult Optimized(const NadarayaWatsonRequest& request, Threads threads) {
  absl::StatusOr<OpResult> result =
      OptimizedEngine(threads).NadarayaWatson(request);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return OpResult{};
  EXPECT_EQ(result->implementation, "cpu-regression");
  EXPECT_EQ(result->weights.empty(), !request.return_weights);
  return std::move(result).value();
}

// Passes when |actual[i] - expected[i]| <= bound[i] for every element and
// actual is finite; names the worst element by its error / bound ratio.
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
           << expected.data[worst] << ", bound " << bound[worst]
           << " (ratio " << worst_ratio << ")";
  }
  return ::testing::AssertionSuccess();
}

// A regression problem owning its data. x_train (n,) or (n, dx), y_train
// (n,) or (n, dy), x_query (m,) or (m, dx).
struct Problem {
  Tensor x_train, y_train, x_query;
  int64_t dx() const { return x_train.shape.size() == 2 ? x_train.shape[1] : 1; }
  int64_t dy() const { return y_train.shape.size() == 2 ? y_train.shape[1] : 1; }
  int64_t n() const { return x_train.shape[0]; }
  int64_t m() const { return x_query.shape[0]; }

  NadarayaWatsonRequest Request(RegressionKernel kernel, float bandwidth,
                                bool return_weights) const {
    NadarayaWatsonRequest r;
    r.x_train = x_train.view();
    r.y_train = y_train.view();
    r.x_query = x_query.view();
    r.kernel = kernel;
    r.bandwidth = bandwidth;
    r.return_weights = return_weights;
    return r;
  }

  double SquaredDistance(int64_t query, int64_t train) const {
    double sum = 0.0;
    for (int64_t c = 0; c < dx(); ++c) {
      const double diff = static_cast<double>(x_query.data[query * dx() + c]) -
                          x_train.data[train * dx() + c];
      sum += diff * diff;
    }
    return sum;
  }
};

// The textbook's data: x uniform in [0, 5), y = 2 sin(x) + x^0.8 + noise;
// queries uniform in [-0.5, 5.5) so some lie outside the training range. In
// the vector layout every coordinate is drawn that way and y has dy = 2
// columns (the function of the first and of the last coordinate).
Problem MakeProblem(int64_t n, int64_t m, bool vector, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> train_x(0.0f, 5.0f);
  std::uniform_real_distribution<float> query_x(-0.5f, 5.5f);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  const int64_t dx = vector ? 3 : 1, dy = vector ? 2 : 1;
  Problem p;
  p.x_train = Tensor::Zeros(vector ? Shape{n, dx} : Shape{n});
  p.y_train = Tensor::Zeros(vector ? Shape{n, dy} : Shape{n});
  p.x_query = Tensor::Zeros(vector ? Shape{m, dx} : Shape{m});
  for (float& x : p.x_train.data) x = train_x(rng);
  for (float& x : p.x_query.data) x = query_x(rng);
  auto f = [](float x) { return 2.0f * std::sin(x) + std::pow(x, 0.8f); };
  for (int64_t i = 0; i < n; ++i) {
    p.y_train.data[i * dy] = f(p.x_train.data[i * dx]) + noise(rng);
    if (vector) {
      p.y_train.data[i * dy + 1] = f(p.x_train.data[i * dx + dx - 1]) + noise(rng);
    }
  }
  return p;
}

struct Bounds {
  std::vector<double> weights, output;
};

// The per-element bounds of the header comment, from the data and the
// reference weights p (double-accumulated, rounded once to float).
Bounds ComputeBounds(const Problem& p, RegressionKernel kernel, float w,
                     const Tensor& reference_weights) {
  const int64_t n = p.n(), m = p.m(), dx = p.dx(), dy = p.dy();
  Bounds b;
  b.weights.assign(m * n, 0.0);
  b.output.assign(m * dy, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> score_error(n, 0.0);
    double mass = 0.0;
    int64_t inside = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double d2 = p.SquaredDistance(i, j);
      const double u = static_cast<double>(w) * std::sqrt(d2);
      const double k = RegressionKernelValue(kernel, u);
      mass += k;
      inside += k > 0.0;
      score_error[j] = (dx + 4) * kU32 * (static_cast<double>(w) * w * d2 / 2);
    }
    double mean_score_error = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      mean_score_error += reference_weights.data[i * n + j] * score_error[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const double pj = reference_weights.data[i * n + j];
      double bound = kSoftmaxRelTol * pj + 1e-7;
      if (kernel == RegressionKernel::kGaussian) {
        bound += pj * (score_error[j] + mean_score_error);
      } else if (kernel == RegressionKernel::kEpanechnikov && mass > 0.0) {
        const double dk = (dx + 3) * kU32;
        bound += dk * (1.0 + inside * pj) / mass;
      }
      b.weights[i * n + j] = bound;
    }
    for (int64_t c = 0; c < dy; ++c) {
      double bound = kAbsTol;
      for (int64_t j = 0; j < n; ++j) {
        const double y = std::fabs(p.y_train.data[j * dy + c]);
        bound += b.weights[i * n + j] * y +
                 kSoftmaxRelTol * reference_weights.data[i * n + j] * y;
      }
      b.output[i * dy + c] = bound;
    }
  }
  return b;
}

// Every weight finite and >= 0; every row sums to 1 or is entirely 0 (only
// allowed for kernels with bounded support, when no point is within reach, in
// which case the prediction is exactly 0).
void ExpectRowInvariants(const Problem& p, RegressionKernel kernel, float w,
                         const OpResult& result) {
  const int64_t n = p.n(), m = p.m(), dy = p.dy();
  for (float v : result.output.data) ASSERT_TRUE(std::isfinite(v)) << v;
  for (float v : result.weights.data) {
    ASSERT_TRUE(std::isfinite(v) && v >= 0.0f) << v;
  }
  if (result.weights.empty()) return;
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += result.weights.data[i * n + j];
    bool any_in_reach = false;
    for (int64_t j = 0; j < n && !any_in_reach; ++j) {
      any_in_reach = RegressionKernelValue(
                         kernel, w * std::sqrt(p.SquaredDistance(i, j))) > 0.0;
    }
    if (kernel == RegressionKernel::kGaussian || any_in_reach) {
      EXPECT_NEAR(sum, 1.0, kRowSumTol) << "query " << i;
    } else {
      EXPECT_TRUE(AllExactly(result.weights, 0.0f, i * n, (i + 1) * n));
      EXPECT_TRUE(AllExactly(result.output, 0.0f, i * dy, (i + 1) * dy));
    }
  }
}

const RegressionKernel kAllKernels[] = {
    RegressionKernel::kGaussian, RegressionKernel::kBoxcar,
    RegressionKernel::kConstant, RegressionKernel::kEpanechnikov};

struct Sizes {
  int64_t n_train, n_query;
};

void PrintTo(const Sizes& s, std::ostream* os) {
  *os << "n_train=" << s.n_train << " n_query=" << s.n_query;
}

using SweepParam =
    std::tuple<RegressionKernel, bool /*vector*/, Sizes, float, Threads>;

class NadarayaWatsonSweepTest : public ::testing::TestWithParam<SweepParam> {
};

TEST_P(NadarayaWatsonSweepTest, MatchesReferenceWithAndWithoutWeights) {
  const auto& [kernel, vector, sizes, bandwidth, threads] = GetParam();
  const Problem p =
      MakeProblem(sizes.n_train, sizes.n_query, vector,
                  static_cast<uint32_t>(17 + 31 * sizes.n_train +
                                        7 * sizes.n_query + (vector ? 3 : 0)));
  const OpResult expected = Reference(p.Request(kernel, bandwidth, true));
  const Bounds bounds = ComputeBounds(p, kernel, bandwidth, expected.weights);
  ExpectRowInvariants(p, kernel, bandwidth, expected);

  const OpResult with_weights =
      Optimized(p.Request(kernel, bandwidth, true), threads);
  const Shape output_shape =
      vector ? Shape{sizes.n_query, 2} : Shape{sizes.n_query};
  ASSERT_EQ(with_weights.output.shape, output_shape);
  ASSERT_EQ(with_weights.weights.shape,
            (Shape{sizes.n_query, sizes.n_train}));
  EXPECT_TRUE(WithinBounds(with_weights.weights, expected.weights,
                           bounds.weights));
  EXPECT_TRUE(
      WithinBounds(with_weights.output, expected.output, bounds.output));
  ExpectRowInvariants(p, kernel, bandwidth, with_weights);

  const OpResult without_weights =
      Optimized(p.Request(kernel, bandwidth, false), threads);
  ASSERT_EQ(without_weights.output.shape, output_shape);
  EXPECT_TRUE(
      WithinBounds(without_weights.output, expected.output, bounds.output));
  ExpectRowInvariants(p, kernel, bandwidth, without_weights);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NadarayaWatsonSweepTest,
    ::testing::Combine(::testing::ValuesIn(kAllKernels),
                       ::testing::Bool(),
                       ::testing::Values(Sizes{1, 1}, Sizes{7, 97},
                                         Sizes{257, 7}, Sizes{97, 33},
                                         Sizes{2, 257}),
                       ::testing::Values(1.0f, 2.5f, 0.4f),
                       ::testing::Values(Threads::kDefault,
                                         Threads::kAlwaysParallel)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      const RegressionKernel kernel = std::get<0>(info.param);
      const bool vector = std::get<1>(info.param);
      const Sizes sizes = std::get<2>(info.param);
      const float bandwidth = std::get<3>(info.param);
      const Threads threads = std::get<4>(info.param);
      return absl::StrCat(
          RegressionKernelName(kernel), vector ? "_Vector_" : "_Scalar_", "n",
          sizes.n_train, "_m", sizes.n_query, "_w",
          static_cast<int>(std::lround(bandwidth * 10)), "tenths_",
          threads == Threads::kDefault ? "Default" : "Parallel");
    });

class NadarayaWatsonEdgeTest : public ::testing::TestWithParam<Threads> {};

// Hand-derived: x_train = (0, 0.5, 2), y_train = (1, 3, 5).
// Query 0.25, w = 1: distances (0.25, 0.25, 1.75).
//   boxcar: K = (1, 1, 0)            -> weights (1/2, 1/2, 0), y = 2
//   epanechnikov: K = (.75, .75, 0)  -> weights (1/2, 1/2, 0), y = 2
//   constant: weights 1/3 each, y = 3
//   gaussian: a = exp(-1/32), b = exp(-49/32): weights (a, a, b) / (2a + b)
// Query 1.25, w = 2: u = (2.5, 1.5, 1.5): boxcar and epanechnikov have no
// point in reach -> weights 0, y = 0; query 1.25, w = 1: u = (1.25, .75, .75)
//   boxcar: (0, 1/2, 1/2), y = 4; epanechnikov: K = (0, .25, .25), y = 4.
TEST_P(NadarayaWatsonEdgeTest, HandDerivedSmallCases) {
  const std::vector<float> x_train = {0.0f, 0.5f, 2.0f};
  const std::vector<float> y_train = {1.0f, 3.0f, 5.0f};
  struct Case {
    RegressionKernel kernel;
    float query, bandwidth;
    std::vector<float> weights;
    float prediction;
  };
  const double a = std::exp(-1.0 / 32), b = std::exp(-49.0 / 32);
  const float ga = static_cast<float>(a / (2 * a + b));
  const float gb = static_cast<float>(b / (2 * a + b));
  const std::vector<Case> cases = {
      {RegressionKernel::kBoxcar, 0.25f, 1.0f, {0.5f, 0.5f, 0.0f}, 2.0f},
      {RegressionKernel::kEpanechnikov, 0.25f, 1.0f, {0.5f, 0.5f, 0.0f}, 2.0f},
      {RegressionKernel::kConstant, 0.25f, 1.0f,
       {1.0f / 3, 1.0f / 3, 1.0f / 3}, 3.0f},
      {RegressionKernel::kGaussian, 0.25f, 1.0f, {ga, ga, gb},
       static_cast<float>((4 * a + 5 * b) / (2 * a + b))},
      {RegressionKernel::kBoxcar, 1.25f, 2.0f, {0.0f, 0.0f, 0.0f}, 0.0f},
      {RegressionKernel::kEpanechnikov, 1.25f, 2.0f, {0.0f, 0.0f, 0.0f}, 0.0f},
      {RegressionKernel::kBoxcar, 1.25f, 1.0f, {0.0f, 0.5f, 0.5f}, 4.0f},
      {RegressionKernel::kEpanechnikov, 1.25f, 1.0f, {0.0f, 0.5f, 0.5f}, 4.0f},
  };
  for (const Case& c : cases) {
    const std::vector<float> query = {c.query};
    NadarayaWatsonRequest r;
    r.x_train = TensorView{x_train.data(), {3}};
    r.y_train = TensorView{y_train.data(), {3}};
    r.x_query = TensorView{query.data(), {1}};
    r.kernel = c.kernel;
    r.bandwidth = c.bandwidth;
    r.return_weights = true;
    Tensor expected_weights = Tensor::Zeros({1, 3});
    expected_weights.data.assign(c.weights.begin(), c.weights.end());
    Tensor expected_output = Tensor::Zeros({1});
    expected_output.data = {c.prediction};
    const std::string label =
        absl::StrCat(RegressionKernelName(c.kernel), " query ", c.query,
                     " bandwidth ", c.bandwidth);
    for (const OpResult& result : {Optimized(r, GetParam()), Reference(r)}) {
      EXPECT_TRUE(AllClose(result.weights, expected_weights, 1e-6)) << label;
      EXPECT_TRUE(AllClose(result.output, expected_output, 1e-6, 1e-6))
          << label;
    }
  }
}

// The textbook's sanity check: with the constant kernel every training point
// gets weight 1/n, so every prediction is the mean of y_train.
TEST_P(NadarayaWatsonEdgeTest, ConstantKernelPredictsTheMean) {
  for (bool vector : {false, true}) {
    const Problem p = MakeProblem(97, 33, vector, 77);
    const int64_t n = p.n(), dy = p.dy();
    Tensor expected = Tensor::Zeros(vector ? Shape{p.m(), dy} : Shape{p.m()});
    double y_max = 0.0;
    for (int64_t c = 0; c < dy; ++c) {
      double mean = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        mean += p.y_train.data[j * dy + c];
        y_max = std::max(y_max, std::fabs(double{p.y_train.data[j * dy + c]}));
      }
      mean /= n;
      for (int64_t i = 0; i < p.m(); ++i) {
        expected.data[i * dy + c] = static_cast<float>(mean);
      }
    }
    Tensor uniform = Tensor::Zeros({p.m(), n});
    std::fill(uniform.data.begin(), uniform.data.end(), 1.0f / n);
    for (float bandwidth : {1.0f, 3.0f}) {
      const OpResult result = Optimized(
          p.Request(RegressionKernel::kConstant, bandwidth, true), GetParam());
      // Float accumulation of n weighted terms: 2e-5 * max|y| (as above).
      EXPECT_TRUE(AllClose(result.output, expected, kSoftmaxRelTol * y_max))
          << (vector ? "vector" : "scalar");
      EXPECT_TRUE(AllClose(result.weights, uniform, 1e-7, 1e-6));
    }
  }
}

// A boxcar query farther than 1 / w from every training point has no kernel
// mass: the weights and the prediction are exactly zero (not NaN).
TEST_P(NadarayaWatsonEdgeTest, BoxcarFarQueryGivesZero) {
  for (bool vector : {false, true}) {
    Problem p = MakeProblem(50, 4, vector, 78);
    const int64_t dx = p.dx();
    // Queries 0 and 3 are far away; 1 and 2 are at training points.
    for (int64_t c = 0; c < dx; ++c) {
      p.x_query.data[0 * dx + c] = 100.0f;
      p.x_query.data[1 * dx + c] = p.x_train.data[3 * dx + c];
      p.x_query.data[2 * dx + c] = p.x_train.data[7 * dx + c];
      p.x_query.data[3 * dx + c] = -1e4f;
    }
    for (RegressionKernel kernel :
         {RegressionKernel::kBoxcar, RegressionKernel::kEpanechnikov}) {
      for (bool return_weights : {true, false}) {
        const OpResult result =
            Optimized(p.Request(kernel, 1.0f, return_weights), GetParam());
        const int64_t dy = p.dy(), n = p.n();
        EXPECT_TRUE(AllExactly(result.output, 0.0f, 0, dy));
        EXPECT_TRUE(AllExactly(result.output, 0.0f, 3 * dy, 4 * dy));
        for (float v : result.output.data) EXPECT_TRUE(std::isfinite(v));
        if (return_weights) {
          EXPECT_TRUE(AllExactly(result.weights, 0.0f, 0, n));
          EXPECT_TRUE(AllExactly(result.weights, 0.0f, 3 * n, 4 * n));
          ExpectRowInvariants(p, kernel, 1.0f, result);
        }
      }
    }
  }
}

// A Gaussian query far outside the data: every kernel value underflows, but
// the weights are normalised as a softmax of the log-kernel, so they stay
// finite and sum to 1. The score gap between the nearest training point and
// the next is w^2 (d_2^2 - d_1^2) / 2 >= w^2 * D * (x_2 - x_1) for a query
// at distance D, which is in the thousands here: all weight goes to the
// nearest point (within exp(-1000) = 0).
TEST_P(NadarayaWatsonEdgeTest, GaussianFarQueryIsOneHotAtTheNearestPoint) {
  const std::vector<float> x_train = {0.1f, 1.0f, 2.0f, 4.9f};
  const std::vector<float> y_train = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> queries = {1e3f, -1e3f, 1e4f, -3e4f, 1e6f};
  const std::vector<int> nearest = {3, 0, 3, 0, 3};
  NadarayaWatsonRequest r;
  r.x_train = TensorView{x_train.data(), {4}};
  r.y_train = TensorView{y_train.data(), {4}};
  r.x_query = TensorView{queries.data(), {5}};
  r.return_weights = true;
  const OpResult result = Optimized(r, GetParam());
  for (size_t i = 0; i < queries.size(); ++i) {
    double sum = 0.0;
    for (int j = 0; j < 4; ++j) {
      const float w = result.weights.data[i * 4 + j];
      ASSERT_TRUE(std::isfinite(w)) << "query " << queries[i];
      sum += w;
      EXPECT_NEAR(w, j == nearest[i] ? 1.0 : 0.0, 1e-6)
          << "query " << queries[i] << " point " << j;
    }
    EXPECT_NEAR(sum, 1.0, kRowSumTol) << "query " << queries[i];
    EXPECT_NEAR(result.output.data[i], y_train[nearest[i]], 1e-6)
        << "query " << queries[i];
  }
}

// The same for a vector query far away in every coordinate.
TEST_P(NadarayaWatsonEdgeTest, GaussianFarVectorQueryIsFinite) {
  Problem p = MakeProblem(50, 2, /*vector=*/true, 79);
  for (int64_t c = 0; c < 3; ++c) {
    p.x_query.data[c] = 1e3f;
    p.x_query.data[3 + c] = -2e3f;
  }
  const OpResult result =
      Optimized(p.Request(RegressionKernel::kGaussian, 1.0f, true), GetParam());
  ExpectRowInvariants(p, RegressionKernel::kGaussian, 1.0f, result);
  const OpResult expected =
      Reference(p.Request(RegressionKernel::kGaussian, 1.0f, true));
  // Both one-hot at the same nearest point.
  EXPECT_TRUE(AllClose(result.weights, expected.weights, 1e-6));
  EXPECT_TRUE(AllClose(result.output, expected.output, 1e-6, 1e-6));
}

// Finite but extreme distances: the squared distance (1e20)^2 = 1e40 does
// not fit a float. The prediction must still be a finite convex combination
// of the targets with weights summing to 1 (the reference, in double, gives
// uniform weights here: 1e20 absorbs every training x).
TEST_P(NadarayaWatsonEdgeTest, GaussianExtremelyFarQueryIsFinite) {
  const std::vector<float> x_train = {0.1f, 1.0f, 2.0f, 4.9f};
  const std::vector<float> y_train = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> queries = {1e20f, -1e20f, 3e38f};
  NadarayaWatsonRequest r;
  r.x_train = TensorView{x_train.data(), {4}};
  r.y_train = TensorView{y_train.data(), {4}};
  r.x_query = TensorView{queries.data(), {3}};
  r.return_weights = true;
  const OpResult result = Optimized(r, GetParam());
  for (size_t i = 0; i < queries.size(); ++i) {
    double sum = 0.0;
    for (int j = 0; j < 4; ++j) {
      const float w = result.weights.data[i * 4 + j];
      EXPECT_TRUE(std::isfinite(w) && w >= 0.0f)
          << "query " << queries[i] << " point " << j << ": weight " << w;
      sum += w;
    }
    EXPECT_NEAR(sum, 1.0, kRowSumTol) << "query " << queries[i];
    const float y = result.output.data[i];
    EXPECT_TRUE(y >= 1.0f && y <= 4.0f)
        << "query " << queries[i] << ": prediction " << y;
  }
}

// A finite but huge bandwidth w = 1e20 (w^2 does not fit a float): by the
// definition K(w ||x - x_i||), a query exactly at a training point has u = 0
// there and u = 1e20 * d elsewhere, so every kernel puts all the weight on
// the coincident point (boxcar: 0 < 1; gaussian: exp(0) against exp(-huge)).
// A Gaussian query between points still puts all its weight on the nearest.
TEST_P(NadarayaWatsonEdgeTest, HugeBandwidthPicksTheCoincidentPoint) {
  const std::vector<float> x_train = {0.1f, 1.0f, 2.0f, 4.9f};
  const std::vector<float> y_train = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> query = {1.0f, 1.3f};
  for (RegressionKernel kernel : kAllKernels) {
    if (kernel == RegressionKernel::kConstant) continue;
    NadarayaWatsonRequest r;
    r.x_train = TensorView{x_train.data(), {4}};
    r.y_train = TensorView{y_train.data(), {4}};
    r.x_query = TensorView{query.data(), {2}};
    r.kernel = kernel;
    r.bandwidth = 1e20f;
    r.return_weights = true;
    // Query 1.0 coincides with point 1. Query 1.3 is 0.3 from point 1: only
    // the Gaussian reaches it (boxcar and epanechnikov give all-zero rows).
    Tensor expected_weights = Tensor::Zeros({2, 4});
    Tensor expected_output = Tensor::Zeros({2});
    expected_weights.data[1] = 1.0f;
    expected_output.data[0] = 2.0f;
    if (kernel == RegressionKernel::kGaussian) {
      expected_weights.data[4 + 1] = 1.0f;
      expected_output.data[1] = 2.0f;
    }
    const OpResult result = Optimized(r, GetParam());
    EXPECT_TRUE(AllClose(result.weights, expected_weights, 1e-6))
        << RegressionKernelName(kernel);
    EXPECT_TRUE(AllClose(result.output, expected_output, 1e-6))
        << RegressionKernelName(kernel);
    const OpResult reference = Reference(r);
    EXPECT_TRUE(AllClose(reference.weights, expected_weights, 1e-6))
        << RegressionKernelName(kernel) << " (reference)";
  }
}

// Output (m,) for 1-D y_train, (m, dy) for 2-D (including dy = 1); weights
// (m, n) only on request.
TEST_P(NadarayaWatsonEdgeTest, OutputShapes) {
  std::mt19937 rng(80);
  const Tensor x_train = attn::testing::RandomNormal(rng, {9});
  const Tensor x_query = attn::testing::RandomNormal(rng, {5});
  const Tensor y_1d = attn::testing::RandomNormal(rng, {9});
  const Tensor y_col = Tensor{Shape{9, 1}, y_1d.data};
  const Tensor y_2d = attn::testing::RandomNormal(rng, {9, 4});
  for (RegressionKernel kernel : kAllKernels) {
    NadarayaWatsonRequest r;
    r.x_train = x_train.view();
    r.x_query = x_query.view();
    r.kernel = kernel;
    r.y_train = y_1d.view();
    OpResult result = Optimized(r, GetParam());
    EXPECT_EQ(result.output.shape, (Shape{5}));
    EXPECT_TRUE(result.weights.empty());
    const Tensor out_1d = result.output;

    r.y_train = y_col.view();
    r.return_weights = true;
    result = Optimized(r, GetParam());
    EXPECT_EQ(result.output.shape, (Shape{5, 1}));
    EXPECT_EQ(result.weights.shape, (Shape{5, 9}));
    // Same numbers as the 1-D form.
    EXPECT_EQ(result.output.data, out_1d.data);

    r.y_train = y_2d.view();
    result = Optimized(r, GetParam());
    EXPECT_EQ(result.output.shape, (Shape{5, 4}));
    EXPECT_EQ(result.weights.shape, (Shape{5, 9}));
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, NadarayaWatsonEdgeTest,
                         ::testing::Values(Threads::kDefault,
                                           Threads::kAlwaysParallel),
                         [](const ::testing::TestParamInfo<Threads>& info) {
                           return info.param == Threads::kDefault
                                      ? "Default"
                                      : "Parallel";
                         });

}  // namespace
}  // namespace attn
