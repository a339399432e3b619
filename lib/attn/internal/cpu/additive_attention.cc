// cpu-additive: additive attention. The projections W_q q and W_k k and the
// product with the values run on oneDNN's sgemm; the tanh scores are fused
// loops of ours, 16 keys at a time, accumulated over every feature in
// registers before they are stored; the softmax is the masked prefix one.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "absl/status/status.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/kernel_copy.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

// Row-major C = alpha * A * op(B) + beta * C on one thread (inside an OpenMP
// region oneDNN's sgemm runs sequentially; outside one, callers have set the
// thread count). Returns false if oneDNN reports a failure.
bool Gemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  return dnnl_sgemm('N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                    ldb, beta, c, ldc) == dnnl_success;
}

absl::Status Run(const CpuCall<AdditiveAttentionParams>& call) {
  const AdditiveAttentionParams& p = call.params;
  const int threads = call.threads;
  // Projected queries (B*Lq, h) and keys, stored transposed per batch entry
  // as (h, Lk) so that a score row is a contiguous loop over keys; each
  // feature's row padded with zeros to whole kLanes.
  constexpr int64_t kLanes = 16;
  const int64_t key_stride = (p.lk + kLanes - 1) / kLanes * kLanes;
  std::vector<float> query_features(p.batch * p.lq * p.h);
  std::vector<float> key_features(p.batch * p.lk * p.h);
  std::vector<float> key_features_t(p.batch * p.h * key_stride, 0.0f);
  if (!Gemm(true, p.batch * p.lq, p.h, p.dq, 1.0f, p.q, p.dq, p.w_q, p.dq,
            0.0f, query_features.data(), p.h) ||
      !Gemm(true, p.batch * p.lk, p.h, p.dk, 1.0f, p.k, p.dk, p.w_k, p.dk,
            0.0f, key_features.data(), p.h)) {
    return absl::InternalError("oneDNN sgemm failed");
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.lk; ++j) {
      for (int64_t u = 0; u < p.h; ++u) {
        key_features_t[(b * p.h + u) * key_stride + j] =
            key_features[(b * p.lk + j) * p.h + u];
      }
    }
  }
  std::atomic<bool> failed{false};
  const int64_t tasks = p.batch;
  auto run = [&](int64_t b, std::vector<float>& scores) {
    const float* kt = key_features_t.data() + b * p.h * key_stride;
    float* weights =
        p.weights != nullptr ? p.weights + b * p.lq * p.lk : scores.data();
    int64_t key_end = 0;
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t limit = p.valid.Limit(b, i, p.lk);
      key_end = std::max(key_end, limit);
      float* row = weights + i * p.lk;
      const float* qf = query_features.data() + (b * p.lq + i) * p.h;
      // kLanes keys at a time, their scores accumulated over all h
      // features before they are stored (one pass over the row, not h; and
      // a fixed-width inner loop, which GCC vectorizes across keys).
      for (int64_t j0 = 0; j0 < limit; j0 += kLanes) {
        float scores[kLanes] = {};
        for (int64_t u = 0; u < p.h; ++u) {
          const float a = qf[u];
          const float w = p.w_v[u];
          const float* kf = kt + u * key_stride + j0;
#pragma omp simd
          for (int64_t l = 0; l < kLanes; ++l) scores[l] += w * FastTanh(a + kf[l]);
        }
        std::copy(scores, scores + std::min(kLanes, limit - j0), row + j0);
      }
      SoftmaxPrefixInPlace(row, limit, p.lk, 1.0f);
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

// Every call.
bool Takes(const CpuCall<AdditiveAttentionParams>&) { return true; }

}  // namespace

const CpuImplementation<AdditiveAttentionParams> kAdditiveAttention = {
    "cpu-additive", Takes, Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
