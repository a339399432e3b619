// Fitting the bandwidth of the parametric Gaussian Nadaraya-Watson model on
// the attention-pooling section's data, and the analytic gradient of the
// leave-one-out loss against finite differences.
#include "attn/fit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attn/engine.h"
#include "attn/ops.h"
#include "attn/tensor.h"
#include "attn/validate.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

// The textbook's data: 50 sorted x uniform in [0, 5), y = 2 sin(x) + x^0.8
// plus N(0, 0.5^2) noise.
struct Data {
  Tensor x, y;
};

Data TextbookData(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  Data d{Tensor::Zeros({50}), Tensor::Zeros({50})};
  for (float& x : d.x.data) x = uniform(rng);
  std::sort(d.x.data.begin(), d.x.data.end());
  for (int i = 0; i < 50; ++i) {
    const float x = d.x.data[i];
    d.y.data[i] = 2.0f * std::sin(x) + std::pow(x, 0.8f) + noise(rng);
  }
  return d;
}

// Vector data: x (n, 2) uniform in [0, 5)^2, y (n, 2) = smooth functions of
// x plus noise.
Data VectorData(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  Data d{Tensor::Zeros({n, 2}), Tensor::Zeros({n, 2})};
  for (float& x : d.x.data) x = uniform(rng);
  for (int64_t i = 0; i < n; ++i) {
    const float a = d.x.data[2 * i], b = d.x.data[2 * i + 1];
    d.y.data[2 * i] = 2.0f * std::sin(a) + std::pow(b, 0.8f) + noise(rng);
    d.y.data[2 * i + 1] = std::cos(a + b) + noise(rng);
  }
  return d;
}

Engine& GetEngine() {
  static Engine* const engine = [] {
    auto created = Engine::Create(EngineOptions{});
    return created.ok() ? created->release() : nullptr;
  }();
  if (engine == nullptr) std::abort();
  return *engine;
}

FitBandwidthRequest Request(const Data& d, float initial, int epochs) {
  FitBandwidthRequest r;
  r.x_train = d.x.view();
  r.y_train = d.y.view();
  r.initial_bandwidth = initial;
  r.learning_rate = 0.5f;
  r.epochs = epochs;
  return r;
}

// The validated training pairs, as LeaveOneOutLoss takes them.
NadarayaWatsonParams TrainingPairs(const Data& d) {
  FitBandwidthRequest r = Request(d, 1.0f, 1);
  absl::StatusOr<Plan<NadarayaWatsonParams>> plan = ValidateFitBandwidth(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? plan->params : NadarayaWatsonParams{};
}

struct FitParam {
  float initial;
  int epochs;
};

void PrintTo(const FitParam& p, std::ostream* os) {
  *os << "initial_bandwidth=" << p.initial << " epochs=" << p.epochs;
}

class FitBandwidthTest : public ::testing::TestWithParam<FitParam> {};

// Gradient descent from the initial bandwidth lowers the leave-one-out loss
// and sharpens the kernel (|w| grows: the data's noise is smaller than its
// curvature at the scale of w = 1).
TEST_P(FitBandwidthTest, LossDecreasesAndKernelSharpens) {
  const FitParam param = GetParam();
  const Data d = TextbookData(1);
  absl::StatusOr<FitBandwidthResult> fit =
      GetEngine().FitBandwidth(Request(d, param.initial, param.epochs));
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_EQ(fit->loss_per_epoch.size(), static_cast<size_t>(param.epochs));
  for (double loss : fit->loss_per_epoch) {
    ASSERT_TRUE(std::isfinite(loss) && loss > 0.0) << loss;
  }
  ASSERT_TRUE(std::isfinite(fit->bandwidth));
  EXPECT_LT(fit->loss_per_epoch.back(), fit->loss_per_epoch.front());
  EXPECT_LT(fit->final_loss, fit->loss_per_epoch.front());
  EXPECT_GT(std::fabs(fit->bandwidth), param.initial);

  // The reported losses are the loss function's values: the first at the
  // initial bandwidth, the final one at the fitted bandwidth (which is
  // reported rounded to float, hence the relative tolerance).
  const NadarayaWatsonParams pairs = TrainingPairs(d);
  EXPECT_DOUBLE_EQ(fit->loss_per_epoch.front(),
                   LeaveOneOutLoss(pairs, param.initial).loss);
  const double at_fitted = LeaveOneOutLoss(pairs, fit->bandwidth).loss;
  EXPECT_NEAR(fit->final_loss, at_fitted, 1e-5 * at_fitted);
}

// With the fitted (sharper) bandwidth the attention weights concentrate:
// on 50 query points in [0, 5) the largest weight per query is larger on
// average than with the nonparametric w = 1.
TEST_P(FitBandwidthTest, FittedBandwidthGivesSharperAttention) {
  const FitParam param = GetParam();
  const Data d = TextbookData(1);
  absl::StatusOr<FitBandwidthResult> fit =
      GetEngine().FitBandwidth(Request(d, param.initial, param.epochs));
  ASSERT_TRUE(fit.ok()) << fit.status();

  Tensor queries = Tensor::Zeros({50});
  for (int i = 0; i < 50; ++i) queries.data[i] = 0.1f * i;
  auto mean_max_weight = [&](float bandwidth) {
    NadarayaWatsonRequest r;
    r.x_train = d.x.view();
    r.y_train = d.y.view();
    r.x_query = queries.view();
    r.kernel = RegressionKernel::kGaussian;
    r.bandwidth = bandwidth;
    r.return_weights = true;
    absl::StatusOr<OpResult> result = GetEngine().NadarayaWatson(r);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return 0.0;
    EXPECT_EQ(result->implementation, "cpu-regression");
    EXPECT_EQ(result->weights.shape, (Shape{50, 50}));
    double total = 0.0;
    for (int i = 0; i < 50; ++i) {
      total += *std::max_element(result->weights.data.begin() + i * 50,
                                 result->weights.data.begin() + (i + 1) * 50);
    }
    return total / 50;
  };
  const double fitted = mean_max_weight(std::fabs(fit->bandwidth));
  const double nonparametric = mean_max_weight(1.0f);
  EXPECT_GT(fitted, nonparametric)
      << "fitted w = " << fit->bandwidth;
}

INSTANTIATE_TEST_SUITE_P(
    Textbook, FitBandwidthTest,
    ::testing::Values(FitParam{1.0f, 5}, FitParam{1.0f, 10},
                      FitParam{0.5f, 5}, FitParam{0.5f, 10}),
    [](const ::testing::TestParamInfo<FitParam>& info) {
      return std::string(info.param.initial == 1.0f ? "From1" : "FromHalf") +
             "_" + std::to_string(info.param.epochs) + "Epochs";
    });

// dL/dw against the central difference (L(w + h) - L(w - h)) / 2h with
// h = 1e-4: its truncation error is h^2 / 6 |L'''| (~1e-8 relative here) and
// its rounding error ~1e-16 |L| / h, so 1e-4 relative leaves a wide margin
// while any wrong term in the analytic gradient shows up at O(1).
void ExpectGradientMatchesFiniteDifference(const NadarayaWatsonParams& pairs,
                                           double w) {
  constexpr double kH = 1e-4;
  const LossAndGradient at = LeaveOneOutLoss(pairs, w);
  const double numeric = (LeaveOneOutLoss(pairs, w + kH).loss -
                          LeaveOneOutLoss(pairs, w - kH).loss) /
                         (2 * kH);
  ASSERT_TRUE(std::isfinite(at.loss) && std::isfinite(at.gradient));
  EXPECT_NEAR(at.gradient, numeric,
              1e-4 * std::max(std::fabs(numeric), std::fabs(at.gradient)) +
                  1e-12 * at.loss)
      << "w = " << w << ", loss " << at.loss;
  // Only w^2 enters the model: L is even in w and dL/dw odd.
  const LossAndGradient mirrored = LeaveOneOutLoss(pairs, -w);
  EXPECT_NEAR(mirrored.loss, at.loss, 1e-12 * at.loss);
  EXPECT_NEAR(mirrored.gradient, -at.gradient,
              1e-12 * (std::fabs(at.gradient) + at.loss));
}

TEST(LeaveOneOutLossTest, ScalarGradientMatchesFiniteDifference) {
  const Data d = TextbookData(2);
  const NadarayaWatsonParams pairs = TrainingPairs(d);
  ASSERT_EQ(pairs.dx, 1);
  ASSERT_EQ(pairs.dy, 1);
  for (double w : {0.3, 0.5, 1.0, 1.7, 3.0, 6.0}) {
    ExpectGradientMatchesFiniteDifference(pairs, w);
  }
}

TEST(LeaveOneOutLossTest, VectorGradientMatchesFiniteDifference) {
  const Data d = VectorData(40, 3);
  const NadarayaWatsonParams pairs = TrainingPairs(d);
  ASSERT_EQ(pairs.dx, 2);
  ASSERT_EQ(pairs.dy, 2);
  for (double w : {0.3, 0.5, 1.0, 1.7, 3.0, 6.0}) {
    ExpectGradientMatchesFiniteDifference(pairs, w);
  }
}

// The gradient is not vacuously small: away from the optimum a step against
// it lowers the loss.
TEST(LeaveOneOutLossTest, SmallStepAgainstGradientLowersLoss) {
  const Data d = TextbookData(2);
  const NadarayaWatsonParams pairs = TrainingPairs(d);
  for (double w : {0.3, 1.0}) {
    const LossAndGradient at = LeaveOneOutLoss(pairs, w);
    ASSERT_NE(at.gradient, 0.0);
    const double step = 1e-3 / std::fabs(at.gradient);
    EXPECT_LT(LeaveOneOutLoss(pairs, w - step * at.gradient).loss, at.loss)
        << "w = " << w;
  }
}

// Hand-derived: with two training points each is predicted from the other
// alone (weight 1 whatever w is), so L = 2 ||y_0 - y_1||^2 and dL/dw = 0.
TEST(LeaveOneOutLossTest, TwoPointsHandDerived) {
  const std::vector<float> x = {0.5f, 2.0f, 0.0f, 1.0f};
  const std::vector<float> y = {1.0f, -2.0f, 3.0f, 0.5f};
  // Scalar: y = (1, -2): L = 2 * 9 = 18.
  NadarayaWatsonParams scalar;
  scalar.x_train = x.data();
  scalar.y_train = y.data();
  scalar.n_train = 2;
  scalar.dx = 1;
  scalar.dy = 1;
  // Vector: x rows (0.5, 2), (0, 1); y rows (1, -2), (3, 0.5):
  // L = 2 * ((1 - 3)^2 + (-2 - 0.5)^2) = 2 * 10.25 = 20.5.
  NadarayaWatsonParams vector = scalar;
  vector.dx = 2;
  vector.dy = 2;
  for (double w : {0.5, 1.0, 4.0}) {
    const LossAndGradient s = LeaveOneOutLoss(scalar, w);
    EXPECT_NEAR(s.loss, 18.0, 1e-12);
    EXPECT_NEAR(s.gradient, 0.0, 1e-12);
    const LossAndGradient v = LeaveOneOutLoss(vector, w);
    EXPECT_NEAR(v.loss, 20.5, 1e-12);
    EXPECT_NEAR(v.gradient, 0.0, 1e-12);
  }
  // And the fit leaves w where it started (a zero gradient).
  absl::StatusOr<FitBandwidthResult> fit = GetEngine().FitBandwidth(
      FitBandwidthRequest{TensorView{x.data(), {2}}, TensorView{y.data(), {2}},
                          1.5f, 0.5f, 3, {}});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->bandwidth, 1.5f);
  for (double loss : fit->loss_per_epoch) EXPECT_NEAR(loss, 18.0, 1e-12);
}

// A vector fit through the Engine also lowers the loss.
TEST(FitBandwidthVectorTest, LossDecreases) {
  const Data d = VectorData(40, 4);
  FitBandwidthRequest r = Request(d, 1.0f, 10);
  r.learning_rate = 0.05f;
  absl::StatusOr<FitBandwidthResult> fit = GetEngine().FitBandwidth(r);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_EQ(fit->loss_per_epoch.size(), 10u);
  EXPECT_LT(fit->final_loss, fit->loss_per_epoch.front());
  EXPECT_LT(fit->loss_per_epoch.back(), fit->loss_per_epoch.front());
}

// A fit polls stop_requested once per epoch and stops with CANCELLED.
TEST(FitStopTest, StopRequestedEndsTheFit) {
  const std::vector<float> x = {0.1f, 0.5f, 1.0f, 2.0f};
  const std::vector<float> y = {1.0f, 2.0f, 1.5f, 0.5f};
  FitBandwidthRequest request;
  request.x_train = TensorView{x.data(), {4}};
  request.y_train = TensorView{y.data(), {4}};
  request.epochs = 1000;
  int polls = 0;
  request.stop_requested = [&polls] { return ++polls > 3; };
  absl::StatusOr<FitBandwidthResult> fit = GetEngine().FitBandwidth(request);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(polls, 4);
}

// Alternating targets: the nearest neighbours of each point disagree with
// it, so the loss grows with w (a positive gradient at w = 1).
struct Alternating {
  std::vector<float> x = {0.0f, 1.0f, 2.0f, 3.0f};
  std::vector<float> y = {0.0f, 10.0f, 0.0f, 10.0f};
  FitBandwidthRequest Request(float learning_rate, int epochs) const {
    FitBandwidthRequest r;
    r.x_train = TensorView{x.data(), {4}};
    r.y_train = TensorView{y.data(), {4}};
    r.initial_bandwidth = 1.0f;
    r.learning_rate = learning_rate;
    r.epochs = epochs;
    return r;
  }
};

// A step that overshoots past zero gives a negative w; the fit reports |w|
// (only w^2 enters the model), which is also what a saved model needs.
TEST(FitBandwidthSignTest, NegativeStepIsReportedAsItsMagnitude) {
  const Alternating data;
  absl::StatusOr<Plan<NadarayaWatsonParams>> plan =
      ValidateFitBandwidth(data.Request(0.5f, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double gradient = LeaveOneOutLoss(plan->params, 1.0).gradient;
  ASSERT_GT(gradient, 0.0);
  // One step of 3 / gradient takes w from 1 to -2.
  const float learning_rate = static_cast<float>(3.0 / gradient);
  absl::StatusOr<FitBandwidthResult> fit =
      GetEngine().FitBandwidth(data.Request(learning_rate, 1));
  ASSERT_TRUE(fit.ok()) << fit.status();
  const double w = 1.0 - static_cast<double>(learning_rate) * gradient;
  ASSERT_LT(w, 0.0);
  EXPECT_FLOAT_EQ(fit->bandwidth, static_cast<float>(-w));
  EXPECT_DOUBLE_EQ(fit->final_loss, LeaveOneOutLoss(plan->params, -w).loss);
}

// A learning rate far too large sends w past float's range: the fit says it
// diverged, naming learning_rate, instead of answering an infinite
// bandwidth (found by fuzz/typed_request).
TEST(FitBandwidthDivergenceTest, HugeLearningRateIsRefused) {
  const Alternating data;
  absl::StatusOr<FitBandwidthResult> fit =
      GetEngine().FitBandwidth(data.Request(1e38f, 1));
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fit.status().message().find("learning_rate"), std::string::npos)
      << fit.status();
}

// Inputs near float's range at the default learning rate: the first step
// sends w past float's range (it would then give inf * 0 = NaN in the
// scores). Refused, never answered OK with NaN.
TEST(FitBandwidthDivergenceTest, HugeInputsAreRefusedNotAnsweredWithNaN) {
  std::vector<float> x(20), y(20);
  for (int i = 0; i < 20; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = static_cast<float>(i % 2) * 10.0f;
  }
  x[7] = 3e25f;
  x[13] = -2e29f;
  y[3] = 1e28f;
  FitBandwidthRequest r;
  r.x_train = TensorView{x.data(), {20}};
  r.y_train = TensorView{y.data(), {20}};
  r.initial_bandwidth = 1.0f;
  r.learning_rate = 0.5f;
  r.epochs = 5;
  absl::StatusOr<FitBandwidthResult> fit = GetEngine().FitBandwidth(r);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fit.status().message().find("learning_rate"), std::string::npos)
      << fit.status();
}

// A fit from a bandwidth near 0 stays there (the gradient vanishes with w)
// and would answer 0 or a subnormal that rounds to 0, a bandwidth no model
// accepts; it stops at float's smallest normal value instead (found by
// fuzz/typed_request and fuzz/validate).
TEST(FitBandwidthSignTest, BandwidthNeverReachesZero) {
  const std::vector<float> x = {-0.3f, -1.78f, 1.48f, 0.28f};
  const std::vector<float> y = {-1.2f, 0.02f, -0.06f, -0.57f};
  FitBandwidthRequest r;
  r.x_train = TensorView{x.data(), {4}};
  r.y_train = TensorView{y.data(), {4}};
  r.initial_bandwidth = 9.80908925e-45f;  // subnormal, positive: valid
  r.learning_rate = 0.5f;
  r.epochs = 5;
  absl::StatusOr<FitBandwidthResult> fit = GetEngine().FitBandwidth(r);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->bandwidth, std::numeric_limits<float>::min());
  EXPECT_TRUE(std::isfinite(fit->final_loss));
}

}  // namespace
}  // namespace attn
