// cpu-regression: Nadaraya-Watson prediction, one query row at a time,
// every training point scored in a vectorized loop, weights normalised in
// place.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/kernel_copy.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

// Fills row[j] = ||x - x_train[j]||^2 for every training point.
void SquaredDistances(const NadarayaWatsonParams& p, const float* x,
                      float* row) {
  if (p.dx == 1) {
    const float x0 = x[0];
#pragma omp simd
    for (int64_t j = 0; j < p.n_train; ++j) {
      const float diff = x0 - p.x_train[j];
      row[j] = diff * diff;
    }
    return;
  }
  std::fill(row, row + p.n_train, 0.0f);
  for (int64_t j = 0; j < p.n_train; ++j) {
    const float* xt = p.x_train + j * p.dx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < p.dx; ++c) sum += (x[c] - xt[c]) * (x[c] - xt[c]);
    row[j] = sum;
  }
}

// The Gaussian weights of one query in double, for the rows whose float32
// scores overflow (w^2 or ||x - x_j||^2 beyond float range): softmax of
// -(w ||x - x_j||)^2 / 2, as the reference computes it.
void ExactGaussianRow(const NadarayaWatsonParams& p, const float* x,
                      float* row) {
  std::vector<double> scores(p.n_train);
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < p.n_train; ++j) {
    double squared = 0.0;
    for (int64_t c = 0; c < p.dx; ++c) {
      const double diff =
          static_cast<double>(x[c]) - p.x_train[j * p.dx + c];
      squared += diff * diff;
    }
    const double u = p.bandwidth * std::sqrt(squared);
    scores[j] = -u * u / 2.0;
    max = std::max(max, scores[j]);
  }
  double sum = 0.0;
  for (double& score : scores) {
    score = std::exp(score - max);
    sum += score;
  }
  for (int64_t j = 0; j < p.n_train; ++j) {
    row[j] = static_cast<float>(scores[j] / sum);
  }
}

// Turns the squared distances of query `x` in `row` into normalised weights;
// returns false when the kernel mass is zero (the row is then all zeros).
bool Weights(const NadarayaWatsonParams& p, const float* x, float* row) {
  const int64_t n = p.n_train;
  switch (p.kernel) {
    case RegressionKernel::kGaussian: {
      // softmax(-w^2 d^2 / 2): exact normalisation even when every kernel
      // value would underflow. When the largest score is not finite (w^2 or
      // every d^2 overflowed float), the row is redone in double.
      const float factor = -0.5f * p.bandwidth * p.bandwidth;
      Scale(row, n, factor);
      const float max = MaxOf(row, n, -std::numeric_limits<float>::infinity());
      if (!std::isfinite(max) || factor == 0.0f) {
        ExactGaussianRow(p, x, row);
        return true;
      }
      SoftmaxPrefixInPlace(row, n, n, 1.0f);
      return true;
    }
    case RegressionKernel::kBoxcar:
      // u = w * d compared directly: w^2 d^2 could overflow (inf * 0).
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        row[j] = p.bandwidth * __builtin_sqrtf(row[j]) < 1.0f ? 1.0f : 0.0f;
      }
      break;
    case RegressionKernel::kConstant:
      std::fill(row, row + n, 1.0f);
      break;
    case RegressionKernel::kEpanechnikov:
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float u = p.bandwidth * __builtin_sqrtf(row[j]);
        row[j] = u < 1.0f ? 1.0f - u : 0.0f;
      }
      break;
  }
  float mass = 0.0f;
#pragma omp simd reduction(+ : mass)
  for (int64_t j = 0; j < n; ++j) mass += row[j];
  if (!(mass > 0.0f)) {
    std::fill(row, row + n, 0.0f);
    return false;
  }
  Scale(row, n, 1.0f / mass);
  return true;
}

// d - d_min for stored distances: never negative, as d_min is one of them;
// the clamp only guards the assumption.
inline float Gap(float d, float d_min) {
  const float gap = d - d_min;
  return gap > 0.0f ? gap : 0.0f;
}

// The Gaussian prediction of one query with one output column (dy == 1) in
// two sweeps over the training points instead of six: the smallest squared
// distance d_min, then e_j = exp(-w^2/2 (d_j - d_min)) with their sum and
// the sum of e_j y_j in one pass (the softmax's shift by its largest score,
// without a scores row). For dx == 1 the distances are recomputed in each
// sweep (cheaper than storing them); otherwise `row` holds them. Writes the
// normalised weights into `weights` when it is not null (it may be `row`).
// Returns false, having written nothing, when w^2 d_min is beyond float's
// range or w^2 below it: the caller then redoes the row exactly.
bool GaussianPredictOne(const NadarayaWatsonParams& p, const float* x,
                        const float* row, float* weights, float* out) {
  const int64_t n = p.n_train;
  const float factor = -0.5f * p.bandwidth * p.bandwidth;
  const float* xt = p.x_train;
  const float x0 = x[0];
  // For dx == 1, the distance |x - x_j| itself: the nearest point's gap is
  // then (a - a_min)(a + a_min) = 0 exactly. (diff * diff - d_min would
  // not be: the compiler may fuse it into one FMA, whose exact product
  // differs from the rounded d_min by up to half an ulp of d, and w^2/2
  // times that is enough to zero every weight of a query 1e6 away.)
  float a_min = std::numeric_limits<float>::infinity();
  float d_min = std::numeric_limits<float>::infinity();
  if (p.dx == 1) {
#pragma omp simd reduction(min : a_min)
    for (int64_t j = 0; j < n; ++j) {
      const float a = std::fabs(x0 - xt[j]);
      a_min = a < a_min ? a : a_min;
    }
    d_min = a_min * a_min;
  } else {
#pragma omp simd reduction(min : d_min)
    for (int64_t j = 0; j < n; ++j) d_min = row[j] < d_min ? row[j] : d_min;
  }
  // factor == 0 (w^2 below float's range): a flat kernel, but 0 * an
  // infinite distance would be NaN; the exact row has neither problem.
  if (!std::isfinite(factor * d_min) || factor == 0.0f) return false;
  // One sweep: e_j = exp(-w^2/2 gap(j)), their sum and the sum of e_j y_j,
  // storing e_j when asked; the store is decided outside the loop so that
  // each instantiation vectorizes without a branch inside.
  const float* y = p.y_train;
  float sum = 0.0f, acc = 0.0f;
  auto sweep = [&](auto gap) {
    if (weights == nullptr) {
#pragma omp simd reduction(+ : sum, acc)
      for (int64_t j = 0; j < n; ++j) {
        const float e = FastExp(factor * gap(j));
        sum += e;
        acc += e * y[j];
      }
    } else {
#pragma omp simd reduction(+ : sum, acc)
      for (int64_t j = 0; j < n; ++j) {
        const float e = FastExp(factor * gap(j));
        weights[j] = e;
        sum += e;
        acc += e * y[j];
      }
    }
  };
  if (p.dx == 1) {
    sweep([&](int64_t j) {
      const float a = std::fabs(x0 - xt[j]);
      return (a - a_min) * (a + a_min);
    });
  } else {
    sweep([&](int64_t j) { return Gap(row[j], d_min); });
  }
  // sum >= 1: the nearest point's term is exp(0).
  *out = acc / sum;
  if (weights != nullptr) Scale(weights, n, 1.0f / sum);
  return true;
}

absl::Status Run(const CpuCall<NadarayaWatsonParams>& call) {
  const NadarayaWatsonParams& p = call.params;
  const int threads = call.threads;
  auto run = [&](int64_t i, std::vector<float>& scratch) {
    float* row = p.weights != nullptr ? p.weights + i * p.n_train
                                      : scratch.data();
    const float* x = p.x_query + i * p.dx;
    if (p.kernel == RegressionKernel::kGaussian && p.dy == 1) {
      if (p.dx != 1) SquaredDistances(p, x, row);
      if (GaussianPredictOne(p, x, row, p.weights != nullptr ? row : nullptr,
                             p.out + i)) {
        return;
      }
      // Beyond float's range: the exact row, then the plain dot below.
    }
    SquaredDistances(p, x, row);
    const bool any = Weights(p, x, row);
    for (int64_t c = 0; c < p.dy; ++c) {
      float acc = 0.0f;
      if (any) {
        if (p.dy == 1) {
#pragma omp simd reduction(+ : acc)
          for (int64_t j = 0; j < p.n_train; ++j) acc += row[j] * p.y_train[j];
        } else {
          for (int64_t j = 0; j < p.n_train; ++j) {
            acc += row[j] * p.y_train[j * p.dy + c];
          }
        }
      }
      p.out[i * p.dy + c] = acc;
    }
  };
  const size_t scratch_size = p.weights != nullptr ? 0 : p.n_train;
  if (threads <= 1 || p.n_query <= 1) {
    std::vector<float> scratch(scratch_size);
    for (int64_t i = 0; i < p.n_query; ++i) run(i, scratch);
  } else {
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> scratch(scratch_size);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < p.n_query; ++i) run(i, scratch);
    }
  }
  return absl::OkStatus();
}

// Every call.
bool Takes(const CpuCall<NadarayaWatsonParams>&) { return true; }

}  // namespace

const CpuImplementation<NadarayaWatsonParams> kRegression = {"cpu-regression",
                                                             Takes, Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
