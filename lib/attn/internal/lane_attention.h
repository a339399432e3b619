// Attention of a few query rows over many keys, with the rows as the lanes
// of vectors: the kernel for a stored memory's batched queries.
//
// A batch of single-query calls against a stored memory is 2-64 query rows
// against thousands to millions of keys. On such a call the blocked kernel's
// products (cpu_attention.cc) pack each key and value block before using it,
// and stall on its read from memory: the read and the arithmetic add up
// (262,144 keys, d = v = 64, 16 rows: 25 ms, of which ~11 ms is the read;
// BM_MemoryQuery against the same call over a cache-resident memory).
//
// Here the rows are lanes. Each key's elements are broadcast against the
// queries packed lane-wise (qt[c][lane]), so a key block is read once, in
// place and in order, and the next block's keys and values are prefetched
// under the current block's arithmetic. The scores come out key-major (one
// vector of rows per key), so the online softmax's max, exponentials, sums
// and valid-length masks are whole-vector operations across the rows. The
// weighted sum of values runs row-major (values broadcast by probability)
// into the same accumulators as the blocked kernel's.
//
// Internal to cpu_attention.cc: include it inside the ISA region
// (attn/internal/isa.h), after vec_math.h.
#ifndef ATTN_INTERNAL_LANE_ATTENTION_H_
#define ATTN_INTERNAL_LANE_ATTENTION_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/internal/isa.h"
#include "attn/internal/vec_math.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// Floats a vector register holds, and how many registers there are; no lane
// kernel on baseline x86-64 (sixteen 128-bit registers), whose calls keep the
// blocked kernel.
#if defined(ATTN_ISA_AVX512)
inline constexpr int kLaneWidth = 16;
inline constexpr int kLaneRegisters = 32;
#elif defined(ATTN_ISA_AVX2)
inline constexpr int kLaneWidth = 8;
inline constexpr int kLaneRegisters = 16;
#else
inline constexpr int kLaneWidth = 0;
inline constexpr int kLaneRegisters = 0;
#endif

// The most query rows one lane pass takes (a larger batch is in several
// tasks' passes, cpu_attention.cc).
inline constexpr int64_t kMaxLaneRows = 64;

// What one task's pass reads and writes. Pointers are the task's own: q is
// `rows` rows of d, k and v are the whole key and value rows of its batch
// entry (row strides d and dv), out is `rows` rows of dv.
struct LanePass {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t d = 0;
  int64_t dv = 0;
  int64_t key_end = 0;         // keys past every row's limit are not read
  const int64_t* limits = nullptr;  // keys row r attends to: [0, limits[r])
  float scale = 1.0f;
  bool gaussian = false;       // subtract half of each key's squared norm
  int64_t key_block = 256;
};

// Per-thread buffers of a lane pass, grown on demand and kept.
struct LaneScratch {
  std::vector<float> packed_queries;  // [group][c][lane]
  std::vector<float> scores;          // [key][group][lane]: probabilities
  std::vector<float> acc;             // [row][dv]
  std::vector<float> norms;           // [key]: half the squared key norm
  std::vector<float> corrections;     // [group][lane]
};

#if defined(ATTN_ISA_AVX512) || defined(ATTN_ISA_AVX2)
namespace lanes {

// Vectors of L lanes (GCC's vector extension). Spelt out per width: GCC
// drops a vector_size attribute that depends on a template parameter.
template <int L>
struct LaneTypes;
template <>
struct LaneTypes<8> {
  typedef float Floats __attribute__((vector_size(32)));
  typedef uint32_t Words __attribute__((vector_size(32)));
  typedef int32_t Ints __attribute__((vector_size(32)));
};
template <>
struct LaneTypes<16> {
  typedef float Floats __attribute__((vector_size(64)));
  typedef uint32_t Words __attribute__((vector_size(64)));
  typedef int32_t Ints __attribute__((vector_size(64)));
};
template <int L>
using Floats = typename LaneTypes<L>::Floats;
template <int L>
using Words = typename LaneTypes<L>::Words;
template <int L>
using Ints = typename LaneTypes<L>::Ints;

template <int L>
inline Floats<L> Load(const float* from) {
  Floats<L> v;
  __builtin_memcpy(&v, from, sizeof v);
  return v;
}

template <int L>
inline void Store(float* to, const Floats<L>& v) {
  __builtin_memcpy(to, &v, sizeof v);
}

// ExpOfNonPositive (vec_math.h) on every lane.
template <int L>
inline Floats<L> ExpOfNonPositive(const Floats<L>& x) {
  const Floats<L> low = Floats<L>{} - 87.0f;
  const Floats<L> clamped = x < low ? low : x;
  const Floats<L> e = ExpInRangeOf<Floats<L>, Words<L>>(clamped);
  return x < low ? Floats<L>{} : e;
}

// Prefetches the rows of the block after the current one, a few at a time
// while the current block's arithmetic runs (a burst of a whole block's
// lines would wait for the memory as a plain read does).
class Prefetch {
 public:
  Prefetch() = default;
  Prefetch(const float* from, int64_t floats)
      : at_(reinterpret_cast<const char*>(from)), end_(at_ + 4 * floats) {}
  void Lines(int64_t lines) {
    for (; lines > 0 && at_ < end_; --lines, at_ += 64) {
      __builtin_prefetch(at_, /*rw=*/0, /*locality=*/2);
    }
  }

 private:
  const char* at_ = nullptr;
  const char* end_ = nullptr;
};

// Keys per register tile of the scores for `groups` lane groups at a time:
// keys x groups accumulators, the groups' query vectors and a broadcast key
// element fit in the registers.
constexpr int ScoreKeys(int groups) {
  return kLaneRegisters >= 32 ? (groups == 1 ? 8 : groups == 2 ? 6 : 4)
                              : (groups == 1 ? 8 : 5);
}
inline constexpr int kMaxScoreGroups = kLaneRegisters >= 32 ? 4 : 2;

// scores[j][g][lane] = sum_c k[j][c] * qt[g][c][lane] for keys [0, count) and
// groups [g0, g0 + G), T keys at a time.
template <int L, int G>
void ScoreTile(const float* qt, int64_t groups, int64_t g0, const float* k,
               int64_t d, int64_t count, float* scores, Prefetch& next) {
  constexpr int T = ScoreKeys(G);
  const int64_t stride = groups * L;
  const int64_t lines_per_tile = (T * d * 4 + 63) / 64;
  int64_t j = 0;
  for (; j + T <= count; j += T) {
    next.Lines(lines_per_tile);
    Floats<L> acc[T][G] = {};
    for (int64_t c = 0; c < d; ++c) {
      Floats<L> q[G];
      for (int g = 0; g < G; ++g) q[g] = Load<L>(qt + ((g0 + g) * d + c) * L);
      for (int t = 0; t < T; ++t) {
        const Floats<L> key = Floats<L>{} + k[(j + t) * d + c];
        for (int g = 0; g < G; ++g) acc[t][g] += key * q[g];
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int g = 0; g < G; ++g) {
        Store<L>(scores + (j + t) * stride + (g0 + g) * L, acc[t][g]);
      }
    }
  }
  for (; j < count; ++j) {
    Floats<L> acc[G] = {};
    for (int64_t c = 0; c < d; ++c) {
      const Floats<L> key = Floats<L>{} + k[j * d + c];
      for (int g = 0; g < G; ++g) {
        acc[g] += key * Load<L>(qt + ((g0 + g) * d + c) * L);
      }
    }
    for (int g = 0; g < G; ++g) {
      Store<L>(scores + j * stride + (g0 + g) * L, acc[g]);
    }
  }
}

// Groups [g0, g0 + n) with n <= G, on the tile for exactly n.
template <int L, int G>
void ScoreGroups(int64_t n, const float* qt, int64_t groups, int64_t g0,
                 const float* k, int64_t d, int64_t count, float* scores,
                 Prefetch& next) {
  if constexpr (G > 1) {
    if (n < G) {
      return ScoreGroups<L, G - 1>(n, qt, groups, g0, k, d, count, scores,
                                   next);
    }
  }
  ScoreTile<L, G>(qt, groups, g0, k, d, count, scores, next);
}

// The weighted sum's register tile: R rows x C vectors of columns (natural
// width), with the C value vectors of one key and a broadcast probability.
inline constexpr int kPoolRows = kLaneRegisters >= 32 ? 6 : 3;
inline constexpr int kPoolVectors = 4;

// acc[r][c0 + ...] += sum_j p[j][r] v[j][c0 + ...] for rows [r0, r0 + R) and
// C vectors of columns from c0; p is the probabilities, key-major (row
// stride `lanes`).
template <int R, int C>
void PoolTile(const float* p, int64_t lanes, int64_t r0, const float* v,
              int64_t dv, int64_t count, float* acc, int64_t c0,
              Prefetch& next) {
  constexpr int W = kLaneWidth;
  const int64_t lines_per_key = (dv * 4 + 63) / 64;
  Floats<W> a[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      a[r][c] = Load<W>(acc + (r0 + r) * dv + c0 + c * W);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    next.Lines(lines_per_key);
    Floats<W> values[C];
    for (int c = 0; c < C; ++c) values[c] = Load<W>(v + j * dv + c0 + c * W);
    const float* probabilities = p + j * lanes + r0;
    for (int r = 0; r < R; ++r) {
      const Floats<W> weight = Floats<W>{} + probabilities[r];
      for (int c = 0; c < C; ++c) a[r][c] += weight * values[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      Store<W>(acc + (r0 + r) * dv + c0 + c * W, a[r][c]);
    }
  }
}

// PoolTile for exactly `rows` <= R rows and `vectors` <= C column vectors.
template <int R, int C>
void PoolTileOf(int64_t rows, int64_t vectors, const float* p, int64_t lanes,
                int64_t r0, const float* v, int64_t dv, int64_t count,
                float* acc, int64_t c0, Prefetch& next) {
  if constexpr (R > 1) {
    if (rows < R) {
      return PoolTileOf<R - 1, C>(rows, vectors, p, lanes, r0, v, dv, count,
                                  acc, c0, next);
    }
  }
  if constexpr (C > 1) {
    if (vectors < C) {
      return PoolTileOf<R, C - 1>(rows, vectors, p, lanes, r0, v, dv, count,
                                  acc, c0, next);
    }
  }
  PoolTile<R, C>(p, lanes, r0, v, dv, count, acc, c0, next);
}

template <int L>
void Pass(const LanePass& pass, LaneScratch& s) {
  using V = Floats<L>;
  constexpr int kMaxGroups = kMaxLaneRows / L;
  const int64_t groups = (pass.rows + L - 1) / L;
  const int64_t lanes = groups * L;
  const int64_t d = pass.d, dv = pass.dv, block = pass.key_block;

  // Queries packed lane-wise; padding lanes are zero queries whose finite
  // scores and sums are never read back.
  s.packed_queries.assign(groups * d * L, 0.0f);
  for (int64_t r = 0; r < pass.rows; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      s.packed_queries[((r / L) * d + c) * L + r % L] = pass.q[r * d + c];
    }
  }
  if (static_cast<int64_t>(s.scores.size()) < block * lanes) {
    s.scores.resize(block * lanes);
  }
  s.acc.assign(pass.rows * dv, 0.0f);
  s.corrections.resize(lanes);
  if (pass.gaussian && static_cast<int64_t>(s.norms.size()) < block) {
    s.norms.resize(block);
  }
  // Padding lanes never mask; real rows' limits as lane vectors.
  Ints<L> limit[kMaxGroups];
  int64_t min_limit = pass.key_end;
  for (int64_t g = 0; g < groups; ++g) {
    int32_t lane_limits[L];
    for (int lane = 0; lane < L; ++lane) {
      const int64_t r = g * L + lane;
      lane_limits[lane] = static_cast<int32_t>(
          r < pass.rows ? pass.limits[r] : pass.key_end);
      if (r < pass.rows) min_limit = std::min(min_limit, pass.limits[r]);
    }
    __builtin_memcpy(&limit[g], lane_limits, sizeof lane_limits);
  }
  V max[kMaxGroups], sum[kMaxGroups];
  for (int64_t g = 0; g < groups; ++g) {
    max[g] = V{} - std::numeric_limits<float>::infinity();
    sum[g] = V{};
  }
  const V negative_infinity = V{} - std::numeric_limits<float>::infinity();

  float* scores = s.scores.data();
  for (int64_t j0 = 0; j0 < pass.key_end; j0 += block) {
    const int64_t count = std::min(block, pass.key_end - j0);
    const float* k = pass.k + j0 * d;
    const float* v = pass.v + j0 * dv;
    const int64_t next_count = std::clamp<int64_t>(pass.key_end - j0 - block,
                                                   0, block);
    Prefetch next_keys, next_values;
    if (next_count > 0) {
      next_keys = Prefetch(k + block * d, next_count * d);
      next_values = Prefetch(v + block * dv, next_count * dv);
    }

    for (int64_t g0 = 0; g0 < groups; g0 += kMaxScoreGroups) {
      Prefetch none;
      ScoreGroups<L, kMaxScoreGroups>(
          std::min<int64_t>(kMaxScoreGroups, groups - g0),
          s.packed_queries.data(), groups, g0, k, d, count, scores,
          g0 == 0 ? next_keys : none);
    }
    if (pass.gaussian) {
      for (int64_t j = 0; j < count; ++j) {
        float norm = 0.0f;
        for (int64_t c = 0; c < d; ++c) norm += k[j * d + c] * k[j * d + c];
        const V half = V{} + 0.5f * norm;
        for (int64_t g = 0; g < groups; ++g) {
          float* at = scores + j * lanes + g * L;
          Store<L>(at, Load<L>(at) - half);
        }
      }
    }

    // The online softmax, a vector of rows at a time. Keys at or past a
    // row's limit weigh exactly zero; a row with no key yet keeps a -inf
    // max, and its correction is 1 (its accumulator is still zero).
    const bool masking = j0 + count > min_limit;
    for (int64_t g = 0; g < groups; ++g) {
      V block_max = max[g];
      for (int64_t j = 0; j < count; ++j) {
        float* at = scores + j * lanes + g * L;
        V x = Load<L>(at);
        if (masking) {
          const Ints<L> key = Ints<L>{} + static_cast<int32_t>(j0 + j);
          x = key < limit[g] ? x : negative_infinity;
          Store<L>(at, x);
        }
        block_max = x > block_max ? x : block_max;
      }
      const V correction =
          block_max == negative_infinity
              ? V{} + 1.0f
              : ExpOfNonPositive<L>((max[g] - block_max) * pass.scale);
      V block_sum = V{};
      for (int64_t j = 0; j < count; ++j) {
        float* at = scores + j * lanes + g * L;
        const V x = Load<L>(at);
        V e = ExpOfNonPositive<L>((x - block_max) * pass.scale);
        if (masking) e = x == negative_infinity ? V{} : e;
        Store<L>(at, e);
        block_sum += e;
      }
      sum[g] = sum[g] * correction + block_sum;
      max[g] = block_max;
      Store<L>(s.corrections.data() + g * L, correction);
    }
    for (int64_t r = 0; r < pass.rows; ++r) {
      const float correction = s.corrections[r];
      if (correction == 1.0f) continue;
      float* row = s.acc.data() + r * dv;
      for (int64_t c = 0; c < dv; ++c) row[c] *= correction;
    }

    constexpr int64_t kWidth = kLaneWidth > 0 ? kLaneWidth : 1;
    for (int64_t c0 = 0; c0 < dv; c0 += kPoolVectors * kWidth) {
      const int64_t vectors =
          std::min<int64_t>(kPoolVectors, (dv - c0) / kWidth);
      for (int64_t r0 = 0; r0 < pass.rows; r0 += kPoolRows) {
        Prefetch none;
        PoolTileOf<kPoolRows, kPoolVectors>(
            std::min<int64_t>(kPoolRows, pass.rows - r0), vectors, scores,
            lanes, r0, v, dv, count, s.acc.data(), c0,
            c0 == 0 && r0 == 0 ? next_values : none);
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    Store<L>(s.corrections.data() + g * L, sum[g]);
  }
  for (int64_t r = 0; r < pass.rows; ++r) {
    const float total = s.corrections[r];
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t c = 0; c < dv; ++c) {
      pass.out[r * dv + c] = s.acc[r * dv + c] * inverse;
    }
  }
}

}  // namespace lanes
#endif

// Whether LaneAttention takes a task of `rows` query rows over `key_end`
// keys with value width dv: this instruction set has the kernel, the rows
// fill enough lanes to beat the one-row paths, the values fill whole
// vectors, and the call reads enough keys (a stored memory's) for the read
// to be what the blocked kernel loses on.
inline bool LaneAttentionTakes(int64_t rows, int64_t key_end, int64_t dv,
                               int64_t many_keys) {
  return kLaneWidth > 0 && rows >= 2 && rows <= kMaxLaneRows &&
         dv % (kLaneWidth > 0 ? kLaneWidth : 1) == 0 && key_end >= many_keys &&
         key_end <= std::numeric_limits<int32_t>::max();
}

// One task's softmax(q k^T * scale) v over keys [0, key_end) with per-row
// limits, float32 throughout (sums in the order of the blocked kernel's:
// per key block, then across blocks).
inline void LaneAttention(const LanePass& pass, LaneScratch& scratch) {
#if defined(ATTN_ISA_AVX512)
  // Narrow vectors where the rows fill no more: half the arithmetic for
  // 2-8 rows.
  if (pass.rows <= 8) return lanes::Pass<8>(pass, scratch);
  lanes::Pass<16>(pass, scratch);
#elif defined(ATTN_ISA_AVX2)
  lanes::Pass<8>(pass, scratch);
#else
  (void)pass;
  (void)scratch;
#endif
}

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_LANE_ATTENTION_H_
