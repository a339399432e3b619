// Blocked CPU attention (dot-product, Gaussian-score and additive) and the
// masked softmax rows they share.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "attn/internal/cpu_kernels_impl.h"
#include "attn/internal/isa.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// Rows of queries one task owns, and keys per online-softmax step: a
// 64 x 256 score block, a 256-row key block and a 256-row value block stay
// well inside a 512 KiB L2 for d, dv <= 128.
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 256;

// Row-major C = alpha * A * op(B) + beta * C on one thread (inside an OpenMP
// region oneDNN's sgemm runs sequentially; outside one, callers have set the
// thread count). Returns false if oneDNN reports a failure.
bool Gemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  return dnnl_sgemm('N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                    ldb, beta, c, ldc) == dnnl_success;
}

// Runs body(task) for task in [0, tasks) on `threads` OpenMP threads, with
// dynamic scheduling (causal and valid-length masks make tasks uneven).
template <typename Body>
void ParallelFor(int64_t tasks, int threads, const Body& body) {
  if (threads <= 1 || tasks <= 1) {
    for (int64_t task = 0; task < tasks; ++task) body(task);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) body(task);
}

// Gaussian score: -scale * ||q - k||^2 / 2 = scale * q.k - scale * ||k||^2 / 2
// - scale * ||q||^2 / 2. The last term is constant along a softmax row, so
// it is dropped; the key term is subtracted from each score column.
void SubtractKeyNorms(const float* keys, int64_t count, int64_t d,
                      float half_scale, float* scores, int64_t rows,
                      int64_t ld, float* norms) {
  for (int64_t j = 0; j < count; ++j) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < d; ++c) sum += keys[j * d + c] * keys[j * d + c];
    norms[j] = half_scale * sum;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) row[j] -= norms[j];
  }
}

// Per-thread buffers, sized for the call (a toy call must not pay for
// full-size blocks).
struct Scratch {
  int64_t key_block = 0;      // min(kKeyBlock, lk): the row stride of scores
  std::vector<float> scores;  // query block x key_block
  std::vector<float> acc;     // kQueryBlock x dv
  std::vector<float> max;     // kQueryBlock
  std::vector<float> sum;     // kQueryBlock
  std::vector<float> norms;   // key_block
  std::vector<int64_t> limit;  // kQueryBlock
};

// One (batch, head, query block) task of the online-softmax kernel.
bool FusedBlock(const AttentionParams& p, int64_t bh, int64_t q0, int64_t rows,
                Scratch& s) {
  const int64_t b = bh / p.heads;
  const float* q = p.q + (bh * p.lq + q0) * p.d;
  const float* k = p.k + bh * p.lk * p.d;
  const float* v = p.v + bh * p.lk * p.dv;
  float* out = p.out + (bh * p.lq + q0) * p.dv;

  int64_t key_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    s.limit[r] = p.KeyLimit(b, q0 + r);
    key_end = std::max(key_end, s.limit[r]);
  }
  std::fill(s.acc.begin(), s.acc.begin() + rows * p.dv, 0.0f);
  std::fill(s.max.begin(), s.max.begin() + rows, kNegativeInfinity);
  std::fill(s.sum.begin(), s.sum.begin() + rows, 0.0f);

  const int64_t block = s.key_block;
  for (int64_t j0 = 0; j0 < key_end; j0 += block) {
    const int64_t count = std::min(block, key_end - j0);
    if (!Gemm(true, rows, count, p.d, p.scale, q, p.d, k + j0 * p.d, p.d, 0.0f,
              s.scores.data(), block)) {
      return false;
    }
    if (p.score == ScoreKind::kGaussian) {
      SubtractKeyNorms(k + j0 * p.d, count, p.d, 0.5f * p.scale,
                       s.scores.data(), rows, block, s.norms.data());
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s.scores.data() + r * block;
      const int64_t valid = std::clamp<int64_t>(s.limit[r] - j0, 0, count);
      std::fill(row + valid, row + count, 0.0f);
      if (valid == 0) continue;
      const float new_max = MaxOf(row, valid, s.max[r]);
      // exp(-inf - finite) == 0: the first block rescales nothing.
      const float correction = FastExp(s.max[r] - new_max);
      s.sum[r] = s.sum[r] * correction + ExpShiftedAndSum(row, valid, new_max);
      s.max[r] = new_max;
      if (correction != 1.0f) Scale(s.acc.data() + r * p.dv, p.dv, correction);
    }
    if (!Gemm(false, rows, p.dv, count, 1.0f, s.scores.data(), block,
              v + j0 * p.dv, p.dv, 1.0f, s.acc.data(), p.dv)) {
      return false;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = s.sum[r] > 0.0f ? 1.0f / s.sum[r] : 0.0f;
    const float* acc = s.acc.data() + r * p.dv;
#pragma omp simd
    for (int64_t c = 0; c < p.dv; ++c) out[r * p.dv + c] = acc[c] * inverse;
  }
  return true;
}

// One task when the weights are requested: scores of the query block go
// straight into the weights output (row stride lk), are normalised there, and
// the output is one product with the values.
bool WeightsBlock(const AttentionParams& p, int64_t bh, int64_t q0,
                  int64_t rows, Scratch& s) {
  const int64_t b = bh / p.heads;
  const float* q = p.q + (bh * p.lq + q0) * p.d;
  const float* k = p.k + bh * p.lk * p.d;
  const float* v = p.v + bh * p.lk * p.dv;
  float* out = p.out + (bh * p.lq + q0) * p.dv;
  float* weights = p.weights + (bh * p.lq + q0) * p.lk;

  int64_t key_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    s.limit[r] = p.KeyLimit(b, q0 + r);
    key_end = std::max(key_end, s.limit[r]);
  }
  if (key_end > 0) {
    if (!Gemm(true, rows, key_end, p.d, p.scale, q, p.d, k, p.d, 0.0f, weights,
              p.lk)) {
      return false;
    }
    if (p.score == ScoreKind::kGaussian) {
      for (int64_t j0 = 0; j0 < key_end; j0 += s.key_block) {
        const int64_t count = std::min(s.key_block, key_end - j0);
        SubtractKeyNorms(k + j0 * p.d, count, p.d, 0.5f * p.scale,
                         weights + j0, rows, p.lk, s.norms.data());
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    SoftmaxPrefixInPlace(weights + r * p.lk, s.limit[r], p.lk);
  }
  if (key_end == 0) {
    std::fill(out, out + rows * p.dv, 0.0f);
    return true;
  }
  return Gemm(false, rows, p.dv, key_end, 1.0f, weights, p.lk, v, p.dv, 0.0f,
              out, p.dv);
}

}  // namespace

void SoftmaxPrefixInPlace(float* row, int64_t limit, int64_t columns) {
  if (limit > 0) {
    const float max = MaxOf(row, limit, kNegativeInfinity);
    const float sum = ExpShiftedAndSum(row, limit, max);
    Scale(row, limit, 1.0f / sum);
  }
  std::fill(row + limit, row + columns, 0.0f);
}

void CpuMaskedSoftmax(const MaskedSoftmaxParams& p, int threads) {
  ParallelFor(p.batch * p.rows, threads, [&](int64_t task) {
    const int64_t b = task / p.rows;
    const int64_t r = task % p.rows;
    float* row = p.out + task * p.columns;
    std::copy(p.x + task * p.columns, p.x + (task + 1) * p.columns, row);
    SoftmaxPrefixInPlace(row, p.valid.Limit(b, r, p.columns), p.columns);
  });
}

absl::Status CpuAttention(const AttentionParams& p, int threads) {
  const int64_t query_blocks = (p.lq + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = p.batch * p.heads * query_blocks;
  std::atomic<bool> failed{false};
  auto run = [&](int64_t task, Scratch& scratch) {
    const int64_t bh = task / query_blocks;
    const int64_t q0 = (task % query_blocks) * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, p.lq - q0);
    const bool ok = p.weights != nullptr ? WeightsBlock(p, bh, q0, rows, scratch)
                                         : FusedBlock(p, bh, q0, rows, scratch);
    if (!ok) failed.store(true, std::memory_order_relaxed);
  };
  const int64_t query_block = std::min(kQueryBlock, p.lq);
  auto make_scratch = [&] {
    Scratch s;
    s.key_block = std::min(kKeyBlock, p.lk);
    if (p.weights == nullptr) {
      s.scores.resize(query_block * s.key_block);
      s.acc.resize(query_block * p.dv);
      s.max.resize(query_block);
      s.sum.resize(query_block);
    }
    if (p.score == ScoreKind::kGaussian) s.norms.resize(s.key_block);
    s.limit.resize(query_block);
    return s;
  };
  if (threads <= 1 || tasks <= 1) {
    Scratch scratch = make_scratch();
    for (int64_t task = 0; task < tasks; ++task) run(task, scratch);
  } else {
#pragma omp parallel num_threads(threads)
    {
      Scratch scratch = make_scratch();
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) run(task, scratch);
    }
  }
  if (failed.load()) return absl::InternalError("oneDNN sgemm failed");
  return absl::OkStatus();
}

absl::Status CpuAdditiveAttention(const AdditiveAttentionParams& p,
                                  int threads) {
  // Projected queries (B*Lq, h) and keys, stored transposed per batch entry
  // as (h, Lk) so that a score row is a contiguous loop over keys.
  std::vector<float> query_features(p.batch * p.lq * p.h);
  std::vector<float> key_features(p.batch * p.lk * p.h);
  std::vector<float> key_features_t(p.batch * p.h * p.lk);
  if (!Gemm(true, p.batch * p.lq, p.h, p.dq, 1.0f, p.q, p.dq, p.w_q, p.dq,
            0.0f, query_features.data(), p.h) ||
      !Gemm(true, p.batch * p.lk, p.h, p.dk, 1.0f, p.k, p.dk, p.w_k, p.dk,
            0.0f, key_features.data(), p.h)) {
    return absl::InternalError("oneDNN sgemm failed");
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.lk; ++j) {
      for (int64_t u = 0; u < p.h; ++u) {
        key_features_t[(b * p.h + u) * p.lk + j] =
            key_features[(b * p.lk + j) * p.h + u];
      }
    }
  }
  std::atomic<bool> failed{false};
  const int64_t tasks = p.batch;
  auto run = [&](int64_t b, std::vector<float>& scores) {
    const float* kt = key_features_t.data() + b * p.h * p.lk;
    float* weights =
        p.weights != nullptr ? p.weights + b * p.lq * p.lk : scores.data();
    int64_t key_end = 0;
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t limit = p.valid.Limit(b, i, p.lk);
      key_end = std::max(key_end, limit);
      float* row = weights + i * p.lk;
      const float* qf = query_features.data() + (b * p.lq + i) * p.h;
      std::fill(row, row + limit, 0.0f);
      for (int64_t u = 0; u < p.h; ++u) {
        const float a = qf[u];
        const float w = p.w_v[u];
        const float* kf = kt + u * p.lk;
#pragma omp simd
        for (int64_t j = 0; j < limit; ++j) row[j] += w * FastTanh(a + kf[j]);
      }
      SoftmaxPrefixInPlace(row, limit, p.lk);
    }
    float* out = p.out + b * p.lq * p.dv;
    if (key_end == 0) {
      std::fill(out, out + p.lq * p.dv, 0.0f);
    } else if (!Gemm(false, p.lq, p.dv, key_end, 1.0f, weights, p.lk,
                     p.v + b * p.lk * p.dv, p.dv, 0.0f, out, p.dv)) {
      failed.store(true, std::memory_order_relaxed);
    }
  };
  const size_t scratch_size = p.weights != nullptr ? 0 : p.lq * p.lk;
  if (threads <= 1 || tasks <= 1) {
    std::vector<float> scores(scratch_size);
    for (int64_t b = 0; b < tasks; ++b) run(b, scores);
  } else {
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> scores(scratch_size);
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < tasks; ++b) run(b, scores);
    }
  }
  if (failed.load()) return absl::InternalError("oneDNN sgemm failed");
  return absl::OkStatus();
}

const CpuKernels kKernels = {CpuMaskedSoftmax, CpuAttention,
                             CpuAdditiveAttention, CpuNadarayaWatson};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
