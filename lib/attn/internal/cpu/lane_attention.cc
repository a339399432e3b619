// cpu-lane: attention of a few query rows over many keys, with the rows as
// the lanes of vectors: the kernel for a stored memory's batched queries.
// It uses no oneDNN.
//
// A batch of single-query calls against a stored memory is 2-64 query rows
// against thousands to millions of keys. On such a call the blocked kernel's
// products (cpu-fused-blocks) pack each key and value block before using it,
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
// weighted sum of values runs row-major, each probability broadcast against
// its key's values. Float32 on AVX2 and AVX-512; bfloat16 bits on
// AVX512-BF16 (BFloat16Products below).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/status/status.h"
#include "attn/internal/aligned_vector.h"
#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/cpu/kernel_copy.h"
#include "attn/internal/cpu/lane_attention.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

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

// The most query rows one lane pass takes (a task of more keeps the blocked
// kernel: at 128 rows it is as fast).
inline constexpr int64_t kMaxLaneRows = 64;

// What one task's pass reads and writes. Pointers are the task's own: q is
// `rows` rows of d, k and v are the whole key and value rows of its batch
// entry (row strides d and dv), all float32, or all bfloat16 bits where
// `bfloat16`; out is `rows` rows of dv.
struct LanePass {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  bool bfloat16 = false;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t d = 0;
  int64_t dv = 0;
  int64_t key_begin = 0;       // a multiple of key_block
  int64_t key_end = 0;         // keys past every row's limit are not read
  const int64_t* limits = nullptr;  // keys row r attends to: [0, limits[r])
  float scale = 1.0f;
  bool gaussian = false;       // subtract half of each key's squared norm
  int64_t key_block = 256;
  // Where set, the pass covers a share of the keys and leaves each row's
  // raw-score max, sum of exponentials and unnormalised output here (rows,
  // rows, rows x dv) instead of writing out.
  float* partial_max = nullptr;
  float* partial_sum = nullptr;
  float* partial_acc = nullptr;
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
  Prefetch(const void* from, int64_t bytes)
      : from_(static_cast<const char*>(from)), bytes_(bytes) {}
  void Lines(int64_t lines) {
    for (; lines > 0 && done_ < bytes_; --lines, done_ += 64) {
      __builtin_prefetch(from_ + done_, /*rw=*/0, /*locality=*/2);
    }
  }

 private:
  const char* from_ = nullptr;
  int64_t bytes_ = 0;
  int64_t done_ = 0;
};

// f(std::integral_constant<int, n>{}) for a run-time n in [1, kMax]: the
// register tiles' sizes are compile-time, so that their accumulators stay
// in registers, and a remainder takes the tile of its own size.
template <int kMax, typename F>
void WithTileSize(int64_t n, const F& f) {
  if constexpr (kMax > 1) {
    if (n < kMax) return WithTileSize<kMax - 1>(n, f);
  }
  f(std::integral_constant<int, kMax>{});
}

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

// The float32 products of a pass on L lanes.
template <int L>
struct FloatProducts {
  static constexpr int kLanes = L;

  static float Key(const LanePass& pass, int64_t index) {
    return static_cast<const float*>(pass.k)[index];
  }

  // Queries packed lane-wise; padding lanes are zero queries, whose finite
  // scores and sums are never read back.
  static void PackQueries(const LanePass& pass, int64_t groups,
                          LaneScratch& s) {
    const float* q = static_cast<const float*>(pass.q);
    const int64_t d = pass.d;
    s.packed_queries.assign(groups * d * L, 0.0f);
    for (int64_t r = 0; r < pass.rows; ++r) {
      for (int64_t c = 0; c < d; ++c) {
        s.packed_queries[((r / L) * d + c) * L + r % L] = q[r * d + c];
      }
    }
  }

  // s.scores[j][lane] for keys [j0, j0 + count).
  static void Scores(const LanePass& pass, LaneScratch& s, int64_t j0,
                     int64_t count, int64_t groups, Prefetch& next_keys) {
    const float* k = static_cast<const float*>(pass.k) + j0 * pass.d;
    for (int64_t g0 = 0; g0 < groups; g0 += kMaxScoreGroups) {
      Prefetch none;
      Prefetch& next = g0 == 0 ? next_keys : none;
      WithTileSize<kMaxScoreGroups>(groups - g0, [&](auto group_count) {
        ScoreTile<L, group_count()>(s.packed_queries.data(), groups, g0, k,
                                    pass.d, count, s.scores.data(), next);
      });
    }
  }

  // s.acc += the probabilities in s.scores times values [j0, j0 + count).
  static void Pool(const LanePass& pass, LaneScratch& s, int64_t j0,
                   int64_t count, int64_t lanes, Prefetch& next_values) {
    const float* v = static_cast<const float*>(pass.v) + j0 * pass.dv;
    constexpr int64_t kWidth = kLaneWidth;
    for (int64_t c0 = 0; c0 < pass.dv; c0 += kPoolVectors * kWidth) {
      const int64_t vectors =
          std::min<int64_t>(kPoolVectors, (pass.dv - c0) / kWidth);
      for (int64_t r0 = 0; r0 < pass.rows; r0 += kPoolRows) {
        Prefetch none;
        Prefetch& next = c0 == 0 && r0 == 0 ? next_values : none;
        WithTileSize<kPoolRows>(pass.rows - r0, [&](auto row_count) {
          WithTileSize<kPoolVectors>(vectors, [&](auto vector_count) {
            PoolTile<row_count(), vector_count()>(s.scores.data(), lanes, r0,
                                                  v, pass.dv, count,
                                                  s.acc.data(), c0, next);
          });
        });
      }
    }
  }
};

template <typename Products>
void Pass(const LanePass& pass, LaneScratch& s) {
  constexpr int L = Products::kLanes;
  using V = Floats<L>;
  constexpr int kMaxGroups = kMaxLaneRows / L;
  const int64_t groups = (pass.rows + L - 1) / L;
  const int64_t lanes = groups * L;
  const int64_t d = pass.d, dv = pass.dv, block = pass.key_block;
  const int64_t element_bytes = pass.bfloat16 ? 2 : 4;

  Products::PackQueries(pass, groups, s);
  if (static_cast<int64_t>(s.scores.size()) < block * lanes) {
    s.scores.resize(block * lanes);
  }
  s.acc.assign(pass.rows * dv, 0.0f);
  s.corrections.resize(lanes);
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
  for (int64_t j0 = pass.key_begin; j0 < pass.key_end; j0 += block) {
    const int64_t count = std::min(block, pass.key_end - j0);
    const int64_t next_count = std::clamp<int64_t>(pass.key_end - j0 - block,
                                                   0, block);
    Prefetch next_keys, next_values;
    if (next_count > 0) {
      next_keys = Prefetch(
          static_cast<const char*>(pass.k) + (j0 + block) * d * element_bytes,
          next_count * d * element_bytes);
      next_values = Prefetch(
          static_cast<const char*>(pass.v) + (j0 + block) * dv * element_bytes,
          next_count * dv * element_bytes);
    }

    Products::Scores(pass, s, j0, count, groups, next_keys);
    if (pass.gaussian) {
      for (int64_t j = 0; j < count; ++j) {
        float norm = 0.0f;
        for (int64_t c = 0; c < d; ++c) {
          const float x = Products::Key(pass, (j0 + j) * d + c);
          norm += x * x;
        }
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
    Products::Pool(pass, s, j0, count, lanes, next_values);
  }
  for (int64_t g = 0; g < groups; ++g) {
    Store<L>(s.corrections.data() + g * L, sum[g]);
  }
  if (pass.partial_acc != nullptr) {
    for (int64_t g = 0; g < groups; ++g) {
      float maxima[L];
      Store<L>(maxima, max[g]);
      for (int lane = 0; lane < L && g * L + lane < pass.rows; ++lane) {
        pass.partial_max[g * L + lane] = maxima[lane];
        pass.partial_sum[g * L + lane] = s.corrections[g * L + lane];
      }
    }
    std::copy(s.acc.begin(), s.acc.begin() + pass.rows * dv, pass.partial_acc);
    return;
  }
  for (int64_t r = 0; r < pass.rows; ++r) {
    const float total = s.corrections[r];
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t c = 0; c < dv; ++c) {
      pass.out[r * dv + c] = s.acc[r * dv + c] * inverse;
    }
  }
}

#if defined(ATTN_ISA_AVX512)
// bfloat16 products on AVX512-BF16 (VDPBF16PS: the dot product of pairs of
// bfloat16 into float32 lanes), for operands held or rounded as bfloat16
// bits: pairs along the summed dimension, d for the scores (a key's pair is
// one 32-bit word, broadcast as it lies) and the keys for the weighted sum
// (two value rows interleaved once per block, two keys' probabilities per
// lane word). Probabilities are rounded to bfloat16 as the blocked kernel
// rounds them; sums are float32. Only these functions are compiled for the
// extension: the pass calls them per block, and nothing else in the copy may
// use it (AVX-512 CPUs without it exist).
#define ATTN_LANES_BF16 __attribute__((target("avx512bf16")))

inline __m512bh AsPairs(__m512i words) { return (__m512bh)words; }

template <int G>
ATTN_LANES_BF16 void PairScoreTile(const uint32_t* qp, int64_t groups,
                                   int64_t g0, const uint16_t* k, int64_t d,
                                   int64_t count, float* scores,
                                   Prefetch& next) {
  constexpr int T = ScoreKeys(G);
  const int64_t pairs = d / 2, stride = groups * 16;
  const int64_t lines_per_tile = (T * d * 2 + 63) / 64;
  auto key_pair = [&](int64_t j, int64_t c2) {
    uint32_t word;
    __builtin_memcpy(&word, k + j * d + 2 * c2, sizeof word);
    return _mm512_set1_epi32(static_cast<int>(word));
  };
  int64_t j = 0;
  for (; j + T <= count; j += T) {
    next.Lines(lines_per_tile);
    __m512 acc[T][G];
    for (int t = 0; t < T; ++t) {
      for (int g = 0; g < G; ++g) acc[t][g] = _mm512_setzero_ps();
    }
    for (int64_t c2 = 0; c2 < pairs; ++c2) {
      __m512i q[G];
      for (int g = 0; g < G; ++g) {
        q[g] = _mm512_loadu_si512(qp + ((g0 + g) * pairs + c2) * 16);
      }
      for (int t = 0; t < T; ++t) {
        const __m512i key = key_pair(j + t, c2);
        for (int g = 0; g < G; ++g) {
          acc[t][g] = _mm512_dpbf16_ps(acc[t][g], AsPairs(q[g]), AsPairs(key));
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int g = 0; g < G; ++g) {
        _mm512_storeu_ps(scores + (j + t) * stride + (g0 + g) * 16, acc[t][g]);
      }
    }
  }
  for (; j < count; ++j) {
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t c2 = 0; c2 < pairs; ++c2) {
      const __m512i key = key_pair(j, c2);
      for (int g = 0; g < G; ++g) {
        const __m512i q =
            _mm512_loadu_si512(qp + ((g0 + g) * pairs + c2) * 16);
        acc[g] = _mm512_dpbf16_ps(acc[g], AsPairs(q), AsPairs(key));
      }
    }
    for (int g = 0; g < G; ++g) {
      _mm512_storeu_ps(scores + j * stride + (g0 + g) * 16, acc[g]);
    }
  }
}

// acc[r][c0 + ...] += sum over key pairs of pp[pair][r] . vp[pair][c0 + ...]
// for rows [r0, r0 + R) and C vectors of 16 columns.
template <int R, int C>
ATTN_LANES_BF16 void PairPoolTile(const uint32_t* pp, int64_t lanes,
                                  int64_t r0, const uint32_t* vp, int64_t dv,
                                  int64_t pairs, float* acc, int64_t c0) {
  __m512 a[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      a[r][c] = _mm512_loadu_ps(acc + (r0 + r) * dv + c0 + c * 16);
    }
  }
  for (int64_t jp = 0; jp < pairs; ++jp) {
    __m512i values[C];
    for (int c = 0; c < C; ++c) {
      values[c] = _mm512_loadu_si512(vp + jp * dv + c0 + c * 16);
    }
    const uint32_t* weights = pp + jp * lanes + r0;
    for (int r = 0; r < R; ++r) {
      const __m512i weight = _mm512_set1_epi32(static_cast<int>(weights[r]));
      for (int c = 0; c < C; ++c) {
        a[r][c] = _mm512_dpbf16_ps(a[r][c], AsPairs(weight), AsPairs(values[c]));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      _mm512_storeu_ps(acc + (r0 + r) * dv + c0 + c * 16, a[r][c]);
    }
  }
}

struct BFloat16Products {
  static constexpr int kLanes = 16;

  static float Key(const LanePass& pass, int64_t index) {
    return FromBFloat16(static_cast<const uint16_t*>(pass.k)[index]);
  }

  static void PackQueries(const LanePass& pass, int64_t groups,
                          LaneScratch& s) {
    const uint16_t* q = static_cast<const uint16_t*>(pass.q);
    const int64_t pairs = pass.d / 2;
    s.query_pairs.assign(groups * pairs * 16, 0u);
    for (int64_t r = 0; r < pass.rows; ++r) {
      for (int64_t c2 = 0; c2 < pairs; ++c2) {
        s.query_pairs[((r / 16) * pairs + c2) * 16 + r % 16] =
            q[r * pass.d + 2 * c2] |
            static_cast<uint32_t>(q[r * pass.d + 2 * c2 + 1]) << 16;
      }
    }
  }

  ATTN_LANES_BF16 static void Scores(const LanePass& pass, LaneScratch& s,
                                     int64_t j0, int64_t count,
                                     int64_t groups, Prefetch& next_keys) {
    const uint16_t* k = static_cast<const uint16_t*>(pass.k) + j0 * pass.d;
    for (int64_t g0 = 0; g0 < groups; g0 += kMaxScoreGroups) {
      Prefetch none;
      Prefetch& next = g0 == 0 ? next_keys : none;
      WithTileSize<kMaxScoreGroups>(groups - g0, [&](auto group_count) {
        PairScoreTile<group_count()>(s.query_pairs.data(), groups, g0, k,
                                     pass.d, count, s.scores.data(), next);
      });
    }
  }

  ATTN_LANES_BF16 static void Pool(const LanePass& pass, LaneScratch& s,
                                   int64_t j0, int64_t count, int64_t lanes,
                                   Prefetch& next_values) {
    const int64_t dv = pass.dv, pairs = (count + 1) / 2;
    // Word 2i from the first operand's word i, word 2i + 1 from the
    // second's (indices 32 and up).
    alignas(64) int16_t interleave[32];
    for (int i = 0; i < 16; ++i) {
      interleave[2 * i] = static_cast<int16_t>(i);
      interleave[2 * i + 1] = static_cast<int16_t>(32 + i);
    }
    const __m512i to_pairs = _mm512_load_si512(interleave);
    // Word 2i from word i, word 2i + 1 from word 16 + i, of one operand.
    alignas(64) int16_t halves[32];
    for (int i = 0; i < 16; ++i) {
      halves[2 * i] = static_cast<int16_t>(i);
      halves[2 * i + 1] = static_cast<int16_t>(16 + i);
    }
    const __m512i from_halves = _mm512_load_si512(halves);
    // Two keys' probabilities per lane word, rounded to nearest even.
    if (static_cast<int64_t>(s.probability_pairs.size()) < pairs * lanes) {
      s.probability_pairs.resize(pairs * lanes);
    }
    const float* scores = s.scores.data();
    for (int64_t jp = 0; jp < pairs; ++jp) {
      for (int64_t g = 0; g < lanes / 16; ++g) {
        const __m512 first = _mm512_loadu_ps(scores + 2 * jp * lanes + g * 16);
        const __m512 second =
            2 * jp + 1 < count
                ? _mm512_loadu_ps(scores + (2 * jp + 1) * lanes + g * 16)
                : _mm512_setzero_ps();
        // Words 0-15: first's lanes, 16-31: second's; then interleaved.
        const __m512i rounded = (__m512i)_mm512_cvtne2ps_pbh(second, first);
        _mm512_storeu_si512(s.probability_pairs.data() + jp * lanes + g * 16,
                            _mm512_permutexvar_epi16(from_halves, rounded));
      }
    }
    // Two value rows interleaved, a pair of keys per column word, the next
    // block's rows prefetched under it (the pool tiles then read the pairs
    // from the caches).
    if (static_cast<int64_t>(s.value_pairs.size()) < pairs * dv) {
      s.value_pairs.resize(pairs * dv);
    }
    const uint16_t* v = static_cast<const uint16_t*>(pass.v) + j0 * dv;
    const int64_t lines_per_pair = (2 * dv * 2 + 63) / 64;
    for (int64_t jp = 0; jp < pairs; ++jp) {
      next_values.Lines(lines_per_pair);
      const uint16_t* first = v + 2 * jp * dv;
      const bool has_second = 2 * jp + 1 < count;
      for (int64_t c = 0; c < dv; c += 16) {
        const __m512i a = _mm512_castsi256_si512(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + c)));
        const __m512i b =
            has_second ? _mm512_castsi256_si512(_mm256_loadu_si256(
                             reinterpret_cast<const __m256i*>(first + dv + c)))
                       : _mm512_setzero_si512();
        _mm512_storeu_si512(s.value_pairs.data() + jp * dv + c,
                            _mm512_permutex2var_epi16(a, to_pairs, b));
      }
    }
    for (int64_t c0 = 0; c0 < dv; c0 += kPoolVectors * 16) {
      const int64_t vectors = std::min<int64_t>(kPoolVectors, (dv - c0) / 16);
      for (int64_t r0 = 0; r0 < pass.rows; r0 += kPoolRows) {
        WithTileSize<kPoolRows>(pass.rows - r0, [&](auto row_count) {
          WithTileSize<kPoolVectors>(vectors, [&](auto vector_count) {
            PairPoolTile<row_count(), vector_count()>(
                s.probability_pairs.data(), lanes, r0, s.value_pairs.data(),
                dv, pairs, s.acc.data(), c0);
          });
        });
      }
    }
  }
};
#endif  // ATTN_ISA_AVX512

}  // namespace lanes
#endif


// One task's softmax(q k^T * scale) v over keys [0, key_end) with per-row
// limits (sums per key block, then across blocks, as the blocked kernel's).
void LaneAttention(const LanePass& pass, LaneScratch& scratch) {
#if defined(ATTN_ISA_AVX512)
  if (pass.bfloat16) return lanes::Pass<lanes::BFloat16Products>(pass, scratch);
  // Narrow vectors where the rows fill no more: half the arithmetic for
  // 2-8 rows.
  if (pass.rows <= 8) {
    return lanes::Pass<lanes::FloatProducts<8>>(pass, scratch);
  }
  lanes::Pass<lanes::FloatProducts<16>>(pass, scratch);
#elif defined(ATTN_ISA_AVX2)
  lanes::Pass<lanes::FloatProducts<8>>(pass, scratch);
#else
  (void)pass;
  (void)scratch;
#endif
}

// The most keys any row of the call attends to.
int64_t MaxKeyReach(const AttentionParams& p) {
  if (p.valid.kind == ValidLengths::Kind::kNone) {
    return p.causal ? std::min(p.lk, p.lq) : p.lk;
  }
  int64_t reach = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t row = 0; row < p.lq; ++row) {
      reach = std::max(reach, p.KeyLimit(b, row));
    }
  }
  return reach;
}

absl::Status Run(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  const AttentionOperands operands(call);
  const Operands& ops = operands.get();
  ForEachItem(
      TaskCount(p), call.threads, [] { return LaneScratch{}; },
      [&](int64_t task, LaneScratch& scratch) {
        LaneTask(p, ops, TaskAt(p, task), scratch);
        return true;
      });
  return absl::OkStatus();
}

}  // namespace

bool LaneAttentionTakes(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  if (kLaneWidth == 0 || p.weights != nullptr || p.lq < 2 ||
      p.lq > kMaxLaneRows) {
    return false;
  }
  static_assert(kMaxLaneRows <= kQueryBlock, "a task must hold every row");
  if (BFloat16Operands(call)) {
#if defined(ATTN_ISA_AVX512)
    if (!call.cpu.bfloat16_products || call.cpu.amx_products ||
        p.d % 2 != 0 || p.dv % 16 != 0) {
      return false;
    }
#else
    return false;
#endif
  } else if (p.dv % (kLaneWidth > 0 ? kLaneWidth : 1) != 0) {
    return false;
  }
  const int64_t reach = MaxKeyReach(p);
  return reach >= kManyKeys && reach <= std::numeric_limits<int32_t>::max();
}

void LaneTask(const AttentionParams& p, const Operands& ops, const Task& task,
              LaneScratch& s, const KeyShare* share) {
  if (static_cast<int64_t>(s.limits.size()) < task.rows) {
    s.limits.resize(task.rows);
  }
  const int64_t key_end = RowLimits(p, task, s.limits.data());
  LanePass pass;
  pass.q = ops.At(ops.q, (task.bh * p.lq + task.q0) * p.d);
  pass.k = ops.At(ops.k, task.bh * p.lk * p.d);
  pass.v = ops.At(ops.v, task.bh * p.lk * p.dv);
  pass.bfloat16 = ops.type == BlockOperands::kBFloat16;
  pass.out = p.out + (task.bh * p.lq + task.q0) * p.dv;
  pass.rows = task.rows;
  pass.d = p.d;
  pass.dv = p.dv;
  pass.key_begin = share != nullptr ? share->begin : 0;
  pass.key_end = share != nullptr ? std::min(key_end, share->end) : key_end;
  pass.limits = s.limits.data();
  if (share != nullptr) {
    pass.partial_max = share->max;
    pass.partial_sum = share->sum;
    pass.partial_acc = share->acc;
  }
  pass.scale = p.scale;
  pass.gaussian = p.score == ScoreKind::kGaussian;
  pass.key_block = kKeyBlock;
  LaneAttention(pass, s);
}

namespace {

// Its calls, but for those that ask for the log-sum-exp: cpu-key-shares
// runs those, in these lanes.
bool Takes(const CpuCall<AttentionParams>& call) {
  return call.params.log_sum_exp == nullptr && LaneAttentionTakes(call);
}

}  // namespace

const CpuImplementation<AttentionParams> kLaneAttention = {"cpu-lane", Takes,
                                                           Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
