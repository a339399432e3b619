#include "attn/testing/error_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/validate.h"

namespace attn::testing {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;
// exp(x) for x < -87 comes back as 0 from the fast exp (and e^-87 < 2^-125).
constexpr double kFlushFloor = 0x1p-120;

}  // namespace

double Gamma(int64_t n) {
  const double nu = static_cast<double>(n) * kUnitRoundoff;
  return nu / (1.0 - nu);
}

AttentionErrorBounds AttentionBounds(const AttentionRequest& request,
                                     const OpResult& exact) {
  AttentionErrorBounds bounds;
  bounds.weights = Tensor::Zeros(exact.weights.shape);
  bounds.output = Tensor::Zeros(exact.output.shape);
  absl::StatusOr<Plan<AttentionParams>> plan = ValidateAttention(request);
  if (!plan.ok() || exact.weights.empty()) {
    ADD_FAILURE() << "AttentionBounds needs a valid request and the exact "
                     "weights: "
                  << plan.status();
    return bounds;
  }
  const AttentionParams& p = plan->params;
  auto operand = [&](float value) -> double {
    return RoundOperand(value, p.precision);
  };
  const bool gaussian = p.score == ScoreKind::kGaussian;
  std::vector<double> magnitude(p.lk), score(p.lk);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h;
      const float* k = p.k + bh * p.lk * p.d;
      const float* v = p.v + bh * p.lk * p.dv;
      for (int64_t i = 0; i < p.lq; ++i) {
        const int64_t row = bh * p.lq + i;
        const float* q = p.q + row * p.d;
        const int64_t limit = p.KeyLimit(b, i);
        if (limit == 0) continue;  // exactly zero: bound 0
        double max_error = 0.0, max_score = -INFINITY, min_score = INFINITY;
        for (int64_t j = 0; j < limit; ++j) {
          double abs_dot = 0.0, dot = 0.0, key_norm = 0.0;
          for (int64_t c = 0; c < p.d; ++c) {
            const double qc = operand(q[c]), kc = operand(k[j * p.d + c]);
            abs_dot += std::fabs(qc * kc);
            dot += qc * kc;
            key_norm += kc * kc;
          }
          magnitude[j] = p.scale * (abs_dot + (gaussian ? key_norm / 2 : 0.0));
          // The kernels' score; the Gaussian's -|q|^2/2 is constant along the
          // row and cancels in the softmax.
          score[j] = p.scale * (dot - (gaussian ? key_norm / 2 : 0.0));
          max_error = std::max(max_error, Gamma(p.d + 2) * magnitude[j]);
          max_score = std::max(max_score, score[j]);
          min_score = std::min(min_score, score[j]);
        }
        const int64_t rescales = (limit + 63) / 64;
        const double evaluation = Gamma(limit + 8 * rescales + 8);
        const double perturbation = std::expm1(2.0 * max_error);
        const double range = max_score - min_score;
        for (int64_t j = 0; j < limit; ++j) {
          const double p_j = exact.weights.data[row * p.lk + j];
          const double argument =
              kUnitRoundoff * (std::fabs(score[j] - max_score) + range);
          const double rho =
              (1.0 + perturbation) * (1.0 + evaluation) * (1.0 + argument) -
              1.0 + kUnitRoundoff;  // the reference's own rounding to float
          bounds.weights.data[row * p.lk + j] =
              static_cast<float>(p_j * rho + kFlushFloor);
          for (int64_t c = 0; c < p.dv; ++c) {
            bounds.output.data[row * p.dv + c] += static_cast<float>(
                std::fabs(operand(v[j * p.dv + c])) *
                (p_j * (rho + Gamma(limit + 2)) + kFlushFloor));
          }
        }
        for (int64_t c = 0; c < p.dv; ++c) {
          // The reference's own rounding of the output to float.
          float& bound = bounds.output.data[row * p.dv + c];
          bound = static_cast<float>(
              bound * (1.0 + 4 * kUnitRoundoff) +
              kUnitRoundoff * std::fabs(exact.output.data[row * p.dv + c]));
        }
      }
    }
  }
  return bounds;
}

::testing::AssertionResult WithinBounds(const Tensor& actual,
                                        const Tensor& expected,
                                        const Tensor& bound) {
  if (actual.shape != expected.shape || bound.shape != expected.shape) {
    return ::testing::AssertionFailure()
           << "shapes " << ShapeToString(actual.shape) << ", expected "
           << ShapeToString(expected.shape) << ", bound "
           << ShapeToString(bound.shape);
  }
  double worst_ratio = 1.0;
  int64_t worst = -1;
  for (size_t i = 0; i < actual.data.size(); ++i) {
    const double e = expected.data[i];
    if (!std::isfinite(e)) continue;
    const double a = actual.data[i];
    const double error = std::isfinite(a) ? std::fabs(a - e) : INFINITY;
    const double allowed = bound.data[i];
    if (error <= allowed) continue;
    const double ratio = allowed > 0 ? error / allowed : INFINITY;
    if (worst < 0 || ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
  }
  if (worst < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst << " of " << ShapeToString(actual.shape)
         << ": got " << actual.data[worst] << ", expected "
         << expected.data[worst] << ", error "
         << std::fabs(static_cast<double>(actual.data[worst]) -
                      expected.data[worst])
         << " exceeds its derived bound " << bound.data[worst] << " ("
         << worst_ratio << "x)";
}

}  // namespace attn::testing
