#include "attn/testing/error_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/validate.h"

namespace attn::testing {
namespace {

constexpr double kU = 0x1p-24;  // float32's unit roundoff
// exp(x) for x < -87 comes back as 0 from the fast exp (and e^-87 < 2^-125).
constexpr double kFlushFloor = 0x1p-120;

// Bounds of one softmax row (see the header): `score` holds the exact scores
// of entries [0, limit), `max_error` bounds each one's float32 error, `p`
// the exact weights. Writes p_bound[0, limit) and, when dv > 0, adds the
// row's pooling bound to out_bound[0, dv) for values value(j, c), whose
// product may round the probabilities by `probability_rounding` relative.
// Returns the largest relative error of the row's evaluation alone (rho_j
// without the perturbation), for a log-sum-exp bound. `merge_factor`
// multiplies every (1 + rho_j): a merge of pieces' answers
// (AttentionBounds' piece_error).
template <typename Value>
double SoftmaxRow(const std::vector<double>& score, int64_t limit,
                  double max_error, const float* p, float* p_bound,
                  int64_t dv, const Value& value, const float* out_exact,
                  float* out_bound, double probability_rounding = 0.0,
                  double exponential_error = 0.0, double merge_factor = 1.0) {
  double max_score = -INFINITY, min_score = INFINITY;
  for (int64_t j = 0; j < limit; ++j) {
    max_score = std::max(max_score, score[j]);
    min_score = std::min(min_score, score[j]);
  }
  const int64_t rescales = (limit + 63) / 64;
  const double evaluation = Gamma(limit + 8 * rescales + 8);
  const double perturbation = std::expm1(2.0 * max_error);
  const double range = max_score - min_score;
  std::vector<double> out(dv, 0.0);
  double largest_evaluation = 0.0;
  for (int64_t j = 0; j < limit; ++j) {
    const double argument = kU * (std::fabs(score[j] - max_score) + range);
    const double evaluated =
        (1.0 + evaluation) * (1.0 + argument) * (1.0 + exponential_error);
    largest_evaluation = std::max(largest_evaluation, evaluated - 1.0);
    // The last u: the reference's own rounding of p_j to float.
    const double rho =
        (1.0 + perturbation) * evaluated * merge_factor - 1.0 + kU;
    p_bound[j] = static_cast<float>(p[j] * rho + kFlushFloor);
    for (int64_t c = 0; c < dv; ++c) {
      out[c] += std::fabs(value(j, c)) *
                (p[j] * (rho + Gamma(limit + 2) +
                         probability_rounding * (1.0 + rho)) +
                 kFlushFloor);
    }
  }
  for (int64_t c = 0; c < dv; ++c) {
    out_bound[c] = static_cast<float>(out[c] * (1.0 + 4 * kU) +
                                      kU * std::fabs(out_exact[c]));
  }
  return largest_evaluation;
}

ErrorBounds ZerosLike(const OpResult& exact) {
  ErrorBounds bounds;
  bounds.output = Tensor::Zeros(exact.output.shape);
  if (!exact.weights.empty()) bounds.weights = Tensor::Zeros(exact.weights.shape);
  return bounds;
}

// False (with a test failure) when the plan failed or weights are missing.
template <typename Plan>
bool Usable(const absl::StatusOr<Plan>& plan, const OpResult& exact,
            bool needs_weights) {
  if (!plan.ok()) {
    ADD_FAILURE() << "error bounds of an invalid request: " << plan.status();
    return false;
  }
  if (needs_weights && exact.weights.empty()) {
    ADD_FAILURE() << "error bounds need the exact weights (return_weights)";
    return false;
  }
  return true;
}

}  // namespace

double Gamma(int64_t n) {
  const double nu = static_cast<double>(n) * kU;
  return nu / (1.0 - nu);
}

ErrorBounds AttentionBounds(const AttentionRequest& request,
                            const OpResult& exact, double piece_error) {
  ErrorBounds bounds = ZerosLike(exact);
  if (!exact.log_sum_exp.empty()) {
    bounds.log_sum_exp = Tensor::Zeros(exact.log_sum_exp.shape);
  }
  const double merge_factor = std::exp(2.0 * piece_error) * (1.0 + 2 * kU);
  const auto plan = ValidateAttention(request);
  if (!Usable(plan, exact, true)) return bounds;
  const AttentionParams& p = plan->params;
  auto operand = [&](float x) -> double { return RoundOperand(x, p.precision); };
  const bool gaussian = p.score == ScoreKind::kGaussian;
  // bfloat16 products round the probabilities too (attn/internal/cpu/
  // attention_blocks.h), to 8 significant bits: a relative error of at most
  // 2^-8 (half the spacing 2^-7 between bfloat16 values in [1, 2)).
  const double probability_rounding =
      p.precision == Precision::kBFloat16 ? 0x1p-8 : 0.0;
  // Their exponentials need no more than bfloat16 keeps, and the AMX kernels
  // take them so (softmax_avx512.h's Exp2Of16): 2^-18 of its own, and its
  // argument (x - max) * scale * log2(e) rounded three times, 3u of at most
  // 125.5 (below, the result is under the flush floor), ln 2 * 3u * 125.5
  // < 2^-15.9 relative: 2^-15 covers both.
  const double exponential_error =
      p.precision == Precision::kBFloat16 ? 0x1p-15 : 0.0;
  std::vector<double> score(p.lk);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h;
      const float* k = p.k + bh * p.lk * p.d;
      const float* v = p.v + bh * p.lk * p.dv;
      for (int64_t i = 0; i < p.lq; ++i) {
        const int64_t row = bh * p.lq + i;
        const float* q = p.q + row * p.d;
        const int64_t limit = p.KeyLimit(b, i);
        double max_error = 0.0;
        for (int64_t j = 0; j < limit; ++j) {
          double abs_dot = 0.0, dot = 0.0, key_norm = 0.0;
          for (int64_t c = 0; c < p.d; ++c) {
            const double qc = operand(q[c]), kc = operand(k[j * p.d + c]);
            abs_dot += std::fabs(qc * kc);
            dot += qc * kc;
            key_norm += kc * kc;
          }
          const double half_norm = gaussian ? key_norm / 2 : 0.0;
          // The kernels' score; the Gaussian's -|q|^2/2 is constant along
          // the row and cancels in the softmax.
          score[j] = p.scale * (dot - half_norm);
          max_error = std::max(max_error,
                               Gamma(p.d + 2) * p.scale * (abs_dot + half_norm));
        }
        const double evaluation = SoftmaxRow(
            score, limit, max_error, &exact.weights.data[row * p.lk],
            &bounds.weights.data[row * p.lk], p.dv,
            [&](int64_t j, int64_t c) { return operand(v[j * p.dv + c]); },
            &exact.output.data[row * p.dv], &bounds.output.data[row * p.dv],
            probability_rounding, exponential_error,
            piece_error > 0.0 ? merge_factor : 1.0);
        if (bounds.log_sum_exp.empty() || limit == 0) continue;
        double bound = max_error + evaluation / (1.0 - evaluation) +
                       probability_rounding + piece_error +
                       kU * std::fabs(exact.log_sum_exp.data[row]);
        if (gaussian) {
          double squares = 0.0;
          for (int64_t c = 0; c < p.d; ++c) {
            squares += operand(q[c]) * static_cast<double>(operand(q[c]));
          }
          bound += kU * p.scale * squares / 2.0;
        }
        bounds.log_sum_exp.data[row] = static_cast<float>(bound);
      }
    }
  }
  return bounds;
}

ErrorBounds MaskedSoftmaxBounds(const MaskedSoftmaxRequest& request,
                                const OpResult& exact) {
  ErrorBounds bounds = ZerosLike(exact);
  const auto plan = ValidateMaskedSoftmax(request);
  if (!Usable(plan, exact, false)) return bounds;
  const MaskedSoftmaxParams& p = plan->params;
  std::vector<double> score(p.columns);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t offset = (b * p.rows + r) * p.columns;
      for (int64_t j = 0; j < p.columns; ++j) score[j] = p.x[offset + j];
      SoftmaxRow(score, p.valid.Limit(b, r, p.columns), 0.0,
                 &exact.output.data[offset], &bounds.output.data[offset], 0,
                 [](int64_t, int64_t) { return 0.0; }, nullptr, nullptr);
    }
  }
  return bounds;
}

ErrorBounds BatchMatmulBounds(const BatchMatmulRequest& request,
                              const OpResult& exact) {
  ErrorBounds bounds = ZerosLike(exact);
  const auto plan = ValidateBatchMatmul(request);
  if (!Usable(plan, exact, false)) return bounds;
  const BatchMatmulParams& p = plan->params;
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.p; ++j) {
        double magnitude = 0.0;
        for (int64_t l = 0; l < p.k; ++l) {
          magnitude += std::fabs(
              static_cast<double>(
                  RoundOperand(p.a[(n * p.m + i) * p.k + l], p.precision)) *
              RoundOperand(p.b[(n * p.k + l) * p.p + j], p.precision));
        }
        const int64_t at = (n * p.m + i) * p.p + j;
        bounds.output.data[at] = static_cast<float>(
            Gamma(p.k + 1) * magnitude + kU * std::fabs(exact.output.data[at]));
      }
    }
  }
  return bounds;
}

ErrorBounds AdditiveAttentionBounds(const AdditiveAttentionRequest& request,
                                    const OpResult& exact) {
  ErrorBounds bounds = ZerosLike(exact);
  const auto plan = ValidateAdditiveAttention(request);
  if (!Usable(plan, exact, true)) return bounds;
  const AdditiveAttentionParams& p = plan->params;
  // Per batch entry: each key's features (W_k k)_u and sum_c |W_k[u,c] k_c|.
  std::vector<double> key_feature(p.lk * p.h), key_magnitude(p.lk * p.h);
  std::vector<double> score(p.lk);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.lk; ++j) {
      const float* k = p.k + (b * p.lk + j) * p.dk;
      for (int64_t u = 0; u < p.h; ++u) {
        double f = 0.0, m = 0.0;
        for (int64_t c = 0; c < p.dk; ++c) {
          f += static_cast<double>(p.w_k[u * p.dk + c]) * k[c];
          m += std::fabs(static_cast<double>(p.w_k[u * p.dk + c]) * k[c]);
        }
        key_feature[j * p.h + u] = f;
        key_magnitude[j * p.h + u] = m;
      }
    }
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t row = b * p.lq + i;
      const float* q = p.q + row * p.dq;
      const int64_t limit = p.valid.Limit(b, i, p.lk);
      double max_error = 0.0;
      for (int64_t j = 0; j < limit; ++j) {
        double s = 0.0, error = 0.0, terms = 0.0;
        for (int64_t u = 0; u < p.h; ++u) {
          double f = 0.0, m = 0.0;
          for (int64_t c = 0; c < p.dq; ++c) {
            f += static_cast<double>(p.w_q[u * p.dq + c]) * q[c];
            m += std::fabs(static_cast<double>(p.w_q[u * p.dq + c]) * q[c]);
          }
          const double feature = f + key_feature[j * p.h + u];
          const double feature_error = Gamma(p.dq) * m +
                                       Gamma(p.dk) * key_magnitude[j * p.h + u] +
                                       kU * std::fabs(feature);
          const double w = p.w_v[u];
          const double t = std::tanh(feature);
          s += w * t;
          error += std::fabs(w) * (feature_error + 8 * kU);
          terms += std::fabs(w * t);
        }
        score[j] = s;
        max_error = std::max(max_error, error + Gamma(p.h + 1) * terms);
      }
      const float* v = p.v + b * p.lk * p.dv;
      SoftmaxRow(score, limit, max_error, &exact.weights.data[row * p.lk],
                 &bounds.weights.data[row * p.lk], p.dv,
                 [&](int64_t j, int64_t c) { return v[j * p.dv + c]; },
                 &exact.output.data[row * p.dv], &bounds.output.data[row * p.dv]);
    }
  }
  return bounds;
}

ErrorBounds NadarayaWatsonBounds(const NadarayaWatsonRequest& request,
                                 const OpResult& exact) {
  ErrorBounds bounds = ZerosLike(exact);
  const auto plan = ValidateNadarayaWatson(request);
  if (!Usable(plan, exact, true)) return bounds;
  const NadarayaWatsonParams& p = plan->params;
  const int64_t n = p.n_train;
  auto y = [&](int64_t j, int64_t c) -> double { return p.y_train[j * p.dy + c]; };
  std::vector<double> score(n), scaled_distance(n), kernel_error(n);
  for (int64_t i = 0; i < p.n_query; ++i) {
    const float* x = p.x_query + i * p.dx;
    const float* weights = &exact.weights.data[i * n];
    float* weight_bound = &bounds.weights.data[i * n];
    const float* out = &exact.output.data[i * p.dy];
    float* out_bound = &bounds.output.data[i * p.dy];
    for (int64_t j = 0; j < n; ++j) {
      double squared = 0.0;
      for (int64_t c = 0; c < p.dx; ++c) {
        const double diff = static_cast<double>(x[c]) - p.x_train[j * p.dx + c];
        squared += diff * diff;
      }
      scaled_distance[j] = p.bandwidth * std::sqrt(squared);
      score[j] = -scaled_distance[j] * scaled_distance[j] / 2;
    }
    if (p.kernel == RegressionKernel::kGaussian) {
      double max_error = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        max_error = std::max(max_error, Gamma(p.dx + 6) * std::fabs(score[j]));
      }
      SoftmaxRow(score, n, max_error, weights, weight_bound, p.dy, y, out,
                 out_bound);
      continue;
    }
    // Kernel values K_j and their float32 errors; a boxcar point within
    // rounding of its edge may flip, and then only crude bounds hold.
    double mass = 0.0, total_error = 0.0;
    bool may_flip = false;
    for (int64_t j = 0; j < n; ++j) {
      const double u = scaled_distance[j];
      const double u_error = Gamma(p.dx + 4) * u;
      double k = 0.0;
      kernel_error[j] = 0.0;
      switch (p.kernel) {
        case RegressionKernel::kBoxcar:
          k = u < 1.0 ? 1.0 : 0.0;
          may_flip = may_flip || std::fabs(u - 1.0) <= u_error;
          break;
        case RegressionKernel::kConstant:
          k = 1.0;
          break;
        case RegressionKernel::kEpanechnikov:
          k = std::max(0.0, 1.0 - u);
          if (u - u_error < 1.0) kernel_error[j] = u_error + kU;
          break;
        case RegressionKernel::kGaussian:
          break;
      }
      mass += k;
      total_error += kernel_error[j];
    }
    double y_max = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < p.dy; ++c) y_max = std::max(y_max, std::fabs(y(j, c)));
    }
    std::vector<double> out_sum(p.dy, 0.0);
    for (int64_t j = 0; j < n; ++j) {
      double bound = 1.0;
      if (!may_flip) {
        // A row whose mass may vanish in float32 has no relative bound.
        bound = mass > total_error
                    ? (kernel_error[j] + weights[j] * total_error) /
                              (mass - total_error) +
                          Gamma(n + 2) * weights[j] + kU * weights[j]
                    : 1.0;
      }
      weight_bound[j] = static_cast<float>(bound);
      for (int64_t c = 0; c < p.dy; ++c) {
        out_sum[c] += std::fabs(y(j, c)) * (bound + Gamma(n + 2) * weights[j]);
      }
    }
    for (int64_t c = 0; c < p.dy; ++c) {
      out_bound[c] = static_cast<float>(
          may_flip ? 2 * y_max
                   : out_sum[c] * (1.0 + 4 * kU) + kU * std::fabs(out[c]));
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
