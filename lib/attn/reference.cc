#include "attn/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/bfloat16.h"

namespace attn {
namespace {

float Operand(float value, Precision precision) {
  return RoundOperand(value, precision);
}

// Softmax of scores[0, limit) into probabilities; empty when limit == 0.
// Returns log sum_j exp(scores[j]) over the prefix (-inf when it is empty).
double SoftmaxPrefix(const std::vector<double>& scores, int64_t limit,
                     std::vector<double>* probabilities) {
  probabilities->assign(scores.size(), 0.0);
  if (limit == 0) return -std::numeric_limits<double>::infinity();
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < limit; ++j) max_score = std::max(max_score, scores[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < limit; ++j) {
    (*probabilities)[j] = std::exp(scores[j] - max_score);
    sum += (*probabilities)[j];
  }
  for (int64_t j = 0; j < limit; ++j) (*probabilities)[j] /= sum;
  return max_score + std::log(sum);
}

// Writes probabilities to `weights` (if non-null) and sum_j p_j v_j to `out`.
void Pool(const std::vector<double>& probabilities, const float* v,
          int64_t dv, Precision precision, float* out, float* weights) {
  const int64_t columns = static_cast<int64_t>(probabilities.size());
  if (weights != nullptr) {
    for (int64_t j = 0; j < columns; ++j) {
      weights[j] = static_cast<float>(probabilities[j]);
    }
  }
  for (int64_t c = 0; c < dv; ++c) {
    double acc = 0.0;
    for (int64_t j = 0; j < columns; ++j) {
      if (probabilities[j] == 0.0) continue;
      acc += probabilities[j] * Operand(v[j * dv + c], precision);
    }
    out[c] = static_cast<float>(acc);
  }
}

}  // namespace

double RegressionKernelValue(RegressionKernel kernel, double u) {
  switch (kernel) {
    case RegressionKernel::kGaussian:
      return std::exp(-u * u / 2.0);
    case RegressionKernel::kBoxcar:
      return std::fabs(u) < 1.0 ? 1.0 : 0.0;
    case RegressionKernel::kConstant:
      return 1.0;
    case RegressionKernel::kEpanechnikov:
      return std::max(0.0, 1.0 - std::fabs(u));
  }
  return 0.0;
}

absl::StatusOr<const char*> ReferenceBackend::MaskedSoftmax(
    const MaskedSoftmaxParams& p) {
  std::vector<double> scores(p.columns), probabilities;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.rows; ++i) {
      const int64_t offset = (b * p.rows + i) * p.columns;
      for (int64_t j = 0; j < p.columns; ++j) scores[j] = p.x[offset + j];
      SoftmaxPrefix(scores, p.valid.Limit(b, i, p.columns), &probabilities);
      for (int64_t j = 0; j < p.columns; ++j) {
        p.out[offset + j] = static_cast<float>(probabilities[j]);
      }
    }
  }
  return kName;
}

absl::StatusOr<const char*> ReferenceBackend::BatchMatmul(
    const BatchMatmulParams& p) {
  for (int64_t n = 0; n < p.n; ++n) {
    const float* a = p.a + n * p.m * p.k;
    const float* b = p.b + n * p.k * p.p;
    float* c = p.out + n * p.m * p.p;
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.p; ++j) {
        double acc = 0.0;
        for (int64_t l = 0; l < p.k; ++l) {
          acc += static_cast<double>(Operand(a[i * p.k + l], p.precision)) *
                 Operand(b[l * p.p + j], p.precision);
        }
        c[i * p.p + j] = static_cast<float>(acc);
      }
    }
  }
  return kName;
}

absl::StatusOr<const char*> ReferenceBackend::ScaledDotProductAttention(
    const AttentionParams& p) {
  if (p.k_bfloat16 != nullptr) {
    // Widened first: every bfloat16 value is a float exactly.
    const int64_t bh = p.batch * p.heads;
    std::vector<float> k(bh * p.lk * p.d), v(bh * p.lk * p.dv);
    for (size_t i = 0; i < k.size(); ++i) k[i] = WidenBFloat16(p.k_bfloat16[i]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = WidenBFloat16(p.v_bfloat16[i]);
    AttentionParams widened = p;
    widened.k = k.data();
    widened.v = v.data();
    widened.k_bfloat16 = widened.v_bfloat16 = nullptr;
    return ScaledDotProductAttention(widened);
  }
  std::vector<double> scores(p.lk), probabilities;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h;
      const float* k = p.k + bh * p.lk * p.d;
      const float* v = p.v + bh * p.lk * p.dv;
      for (int64_t i = 0; i < p.lq; ++i) {
        const float* q = p.q + (bh * p.lq + i) * p.d;
        const int64_t limit = p.KeyLimit(b, i);
        for (int64_t j = 0; j < p.lk; ++j) {
          double acc = 0.0;
          for (int64_t c = 0; c < p.d; ++c) {
            const double qc = Operand(q[c], p.precision);
            const double kc = Operand(k[j * p.d + c], p.precision);
            acc += p.score == ScoreKind::kDotProduct
                       ? qc * kc
                       : -(qc - kc) * (qc - kc) / 2.0;
          }
          scores[j] = p.scale * acc;
        }
        const double log_sum_exp =
            SoftmaxPrefix(scores, limit, &probabilities);
        if (p.log_sum_exp != nullptr) {
          p.log_sum_exp[bh * p.lq + i] = static_cast<float>(log_sum_exp);
        }
        Pool(probabilities, v, p.dv, p.precision,
             p.out + (bh * p.lq + i) * p.dv,
             p.weights == nullptr ? nullptr
                                  : p.weights + (bh * p.lq + i) * p.lk);
      }
    }
  }
  return kName;
}

absl::StatusOr<const char*> ReferenceBackend::AdditiveAttention(
    const AdditiveAttentionParams& p) {
  std::vector<double> scores(p.lk), probabilities;
  std::vector<double> query_features(p.h), key_features(p.lk * p.h);
  for (int64_t b = 0; b < p.batch; ++b) {
    const float* k = p.k + b * p.lk * p.dk;
    for (int64_t j = 0; j < p.lk; ++j) {
      for (int64_t u = 0; u < p.h; ++u) {
        double acc = 0.0;
        for (int64_t c = 0; c < p.dk; ++c) {
          acc += static_cast<double>(p.w_k[u * p.dk + c]) * k[j * p.dk + c];
        }
        key_features[j * p.h + u] = acc;
      }
    }
    for (int64_t i = 0; i < p.lq; ++i) {
      const float* q = p.q + (b * p.lq + i) * p.dq;
      for (int64_t u = 0; u < p.h; ++u) {
        double acc = 0.0;
        for (int64_t c = 0; c < p.dq; ++c) {
          acc += static_cast<double>(p.w_q[u * p.dq + c]) * q[c];
        }
        query_features[u] = acc;
      }
      for (int64_t j = 0; j < p.lk; ++j) {
        double acc = 0.0;
        for (int64_t u = 0; u < p.h; ++u) {
          acc += p.w_v[u] * std::tanh(query_features[u] + key_features[j * p.h + u]);
        }
        scores[j] = acc;
      }
      SoftmaxPrefix(scores, p.valid.Limit(b, i, p.lk), &probabilities);
      Pool(probabilities, p.v + b * p.lk * p.dv, p.dv, Precision::kFloat32,
           p.out + (b * p.lq + i) * p.dv,
           p.weights == nullptr ? nullptr : p.weights + (b * p.lq + i) * p.lk);
    }
  }
  return kName;
}

absl::StatusOr<const char*> ReferenceBackend::NadarayaWatson(
    const NadarayaWatsonParams& p) {
  std::vector<double> log_kernel(p.n_train), probabilities(p.n_train);
  for (int64_t i = 0; i < p.n_query; ++i) {
    const float* x = p.x_query + i * p.dx;
    double mass = 0.0;
    for (int64_t j = 0; j < p.n_train; ++j) {
      double squared = 0.0;
      for (int64_t c = 0; c < p.dx; ++c) {
        const double diff = static_cast<double>(x[c]) - p.x_train[j * p.dx + c];
        squared += diff * diff;
      }
      const double u = p.bandwidth * std::sqrt(squared);
      probabilities[j] = RegressionKernelValue(p.kernel, u);
      // The Gaussian is normalised as a softmax of its log so that far
      // queries, whose kernel values all underflow, still get weights.
      log_kernel[j] = -u * u / 2.0;
      mass += probabilities[j];
    }
    if (p.kernel == RegressionKernel::kGaussian) {
      SoftmaxPrefix(log_kernel, p.n_train, &probabilities);
      mass = 1.0;
    } else if (mass > 0.0) {
      for (double& w : probabilities) w /= mass;
    } else {
      std::fill(probabilities.begin(), probabilities.end(), 0.0);
    }
    Pool(probabilities, p.y_train, p.dy, Precision::kFloat32,
         p.out + i * p.dy,
         p.weights == nullptr ? nullptr : p.weights + i * p.n_train);
  }
  return kName;
}

}  // namespace attn
