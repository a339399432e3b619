// How much arithmetic a call is: the floating-point operations each
// operation's params imply, counted the same way for every backend. The CPU
// backend decides from it whether a call is worth a second thread; the engine
// decides from it whether a call is worth a GPU round trip.
//
// These are estimates for decisions, not a performance model: a product of
// (m, k) x (k, n) counts 2mkn; exp, tanh and the kernel functions count as a
// few operations each; masks are ignored (a masked call counts as unmasked).
#ifndef ATTN_WORK_H_
#define ATTN_WORK_H_

#include <cstdint>

#include "attn/params.h"

namespace attn {

// Keys one thread takes at least when an attention call with fewer tasks
// (batch entries x heads x query blocks) than threads shares each task's
// keys out among them: a call over fewer than twice this many keys keeps
// its tasks whole, one thread each.
inline constexpr int64_t kMinKeysPerShare = 4096;

inline double EstimatedFlops(const MaskedSoftmaxParams& p) {
  // max, subtract, exp, sum and scale per element.
  return 10.0 * static_cast<double>(p.batch) * p.rows * p.columns;
}

inline double EstimatedFlops(const BatchMatmulParams& p) {
  return 2.0 * static_cast<double>(p.n) * p.m * p.k * p.p;
}

inline double EstimatedFlops(const AttentionParams& p) {
  return 2.0 * static_cast<double>(p.batch) * p.heads * p.lq * p.lk *
         (p.d + p.dv);
}

inline double EstimatedFlops(const AdditiveAttentionParams& p) {
  const double batch = static_cast<double>(p.batch);
  // The two projections, tanh(q' + k') . w_v for every (query, key) pair,
  // and the weighted sum of the values.
  return 2.0 * batch * (p.lq * p.dq + p.lk * p.dk) * p.h +
         12.0 * batch * p.lq * p.lk * p.h + 2.0 * batch * p.lq * p.lk * p.dv;
}

inline double EstimatedFlops(const NadarayaWatsonParams& p) {
  // Distance, kernel and normalisation per (query, training point) pair,
  // then the weighted sum of the targets.
  return static_cast<double>(p.n_query) * p.n_train *
         (3.0 * p.dx + 10.0 + 2.0 * p.dy);
}

}  // namespace attn

#endif  // ATTN_WORK_H_
