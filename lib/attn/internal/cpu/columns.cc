// cpu-columns: float32 attention without weights on AVX-512, each block's
// scores taken transposed (keys down, queries across), for 64 query rows or
// more of heads up to 64 (d and dv): cpu-amx-columns' order of work on
// vector registers.
//
// Why: cpu-fused-blocks runs its softmax along rows of 128 x 256 scores
// written by oneDNN's products, so each row pays its own max and sum
// reductions and its 128 KiB of scores is read and written from L2 three
// times per block. Here a task (128 query rows of one batch entry and
// head, two groups of 64) takes each block's scores as S^T = K Q^T, so a
// query's running max and sum are lanes of vectors and the softmax runs
// down the keys with no reduction; a block of 64 keys, its 16 KiB of scores
// and the group's queries stay in L1, and the two groups take each block of
// keys and values in turn (a stored memory's are read from memory once per
// 128 rows: 128 rows over 262,144 keys ran 78.7 ms with tasks of 64 rows,
// 60.9 ms so, BM_MemoryQuery on one thread). Both products are register
// tiles of fused multiply-adds: S^T takes a key's elements broadcast
// against the queries laid out as Q^T (d rows of 64 queries, once per
// task), and O^T += V^T P^T a value's channels broadcast against the
// probabilities' rows, so the keys and values are read where they lie,
// with no copy.
// The arithmetic is cpu-fused-blocks': float32 products, exp((s - max) *
// scale) by ExpOf64, the sum in float32, and each block's exact max: at
// most one rescale per 64 keys, what the error bound allows
// (attn/testing/error_bounds.cc). (Not cpu-amx-columns' lazy rescaling:
// exponentials taken from an older max round their arguments by up to
// u |s - old max| twice, which float32's bound does not carry, where
// bfloat16's exponential term covers it many times over.)

// GCC 12's unmasked AVX-512 intrinsics pass _mm512_undefined_*() as their
// masked-off source, which -Wmaybe-uninitialized reports wherever they
// inline; nothing undefined is read.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "attn/internal/aligned_vector.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/cpu/kernel_copy.h"
#include "attn/internal/cpu/softmax_avx512.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

#if defined(ATTN_ISA_AVX512)
namespace {

// Query rows per group (four vectors of 16) and groups per task, keys per
// block, the largest d and dv, and the rows of a register tile (keys of
// S^T, channels of O^T): six rows of four vectors are 24 accumulators of
// the 32 registers.
constexpr int64_t kLanes = 16;
constexpr int64_t kGroupRows = 64;
constexpr int kVectors = kGroupRows / kLanes;
constexpr int64_t kGroups = 2;
constexpr int64_t kTaskRows = kGroups * kGroupRows;
constexpr int64_t kBlock = 64;
constexpr int64_t kMaxDepth = 64;
constexpr int kTileRows = 6;
// Fewer rows than a group would leave lanes of every vector idle.
constexpr int64_t kMinRows = kGroupRows;

// One group's queries, accumulators and limits.
struct alignas(64) QueryGroup {
  float queries[kMaxDepth][kGroupRows];  // Q^T
  float acc[kMaxDepth][kGroupRows];      // O^T
  int32_t limit[kGroupRows];
};

// One task's buffers (per thread, reused).
struct alignas(64) ColumnsScratch {
  float scores[kBlock][kGroupRows];  // S^T, then P^T, of the group at work
  QueryGroup groups[kGroups];
};

// st[r][0, 64) = sum_c keys[r][c] qt[c][0, 64) for r < R (keys' row stride
// d).
template <int R>
inline void ScoreRows(const float* keys, int64_t d, const float* qt,
                      float* st) {
  __m512 acc[R][kVectors];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < kVectors; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < d; ++c) {
    __m512 q[kVectors];
    for (int i = 0; i < kVectors; ++i) {
      q[i] = _mm512_load_ps(qt + c * kGroupRows + i * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 k = _mm512_set1_ps(keys[r * d + c]);
      for (int i = 0; i < kVectors; ++i) {
        acc[r][i] = _mm512_fmadd_ps(k, q[i], acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < kVectors; ++i) {
      _mm512_store_ps(st + r * kGroupRows + i * kLanes, acc[r][i]);
    }
  }
}

// ot[r][0, 64) += sum_n values[n][r] pt[n][0, 64) for r < R, n < count
// (values' row stride dv).
template <int R>
inline void PoolRows(const float* values, int64_t dv, int64_t count,
                     const float* pt, float* ot) {
  __m512 acc[R][kVectors];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < kVectors; ++i) {
      acc[r][i] = _mm512_load_ps(ot + r * kGroupRows + i * kLanes);
    }
  }
  for (int64_t n = 0; n < count; ++n) {
    __m512 prob[kVectors];
    for (int i = 0; i < kVectors; ++i) {
      prob[i] = _mm512_load_ps(pt + n * kGroupRows + i * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_set1_ps(values[n * dv + r]);
      for (int i = 0; i < kVectors; ++i) {
        acc[r][i] = _mm512_fmadd_ps(v, prob[i], acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < kVectors; ++i) {
      _mm512_store_ps(ot + r * kGroupRows + i * kLanes, acc[r][i]);
    }
  }
}

template <int R>
using Rows = std::integral_constant<int, R>;

// Runs tile(Rows<R>(), row) over rows [0, count) in tiles of kTileRows and
// one of the rest.
template <typename Tile>
inline void InTiles(int64_t count, const Tile& tile) {
  int64_t row = 0;
  for (; row + kTileRows <= count; row += kTileRows) {
    tile(Rows<kTileRows>(), row);
  }
  switch (count - row) {
    case 5:
      tile(Rows<5>(), row);
      break;
    case 4:
      tile(Rows<4>(), row);
      break;
    case 3:
      tile(Rows<3>(), row);
      break;
    case 2:
      tile(Rows<2>(), row);
      break;
    case 1:
      tile(Rows<1>(), row);
      break;
    default:
      break;
  }
}
static_assert(kTileRows == 6, "InTiles handles remainders up to 5");

// A group's running softmax: per query (a lane), the largest score so far,
// the sum of the exponentials below it, and the end of the keys it attends
// to.
struct Running {
  __m512 max[kVectors], sum[kVectors];
  __m512i limit[kVectors];
};

// The softmax of one block of S^T (keys [j0, j0 + count) down, the group's
// queries across) in place: each query's block max (the sum and O^T's
// column rescaled where it moved), then P^T = exp((S^T - max) * scale),
// masked past each query's limit unless kWhole (every query attends to the
// whole block).
template <bool kWhole>
inline void BlockSoftmax(float scale_factor, int64_t j0, int64_t count,
                         int64_t dv, Running& run,
                         float (&scores)[kBlock][kGroupRows],
                         float (&accumulators)[kMaxDepth][kGroupRows]) {
  const __m512 scale = _mm512_set1_ps(scale_factor);
  auto valid = [&](int i, int64_t r) -> __mmask16 {
    if constexpr (kWhole) {
      return 0xffff;
    } else {
      return _mm512_cmpgt_epi32_mask(
          run.limit[i], _mm512_set1_epi32(static_cast<int32_t>(j0 + r)));
    }
  };
  auto max_of = [&](__m512 so_far, int i, int64_t r) {
    const __m512 x = _mm512_load_ps(&scores[r][i * kLanes]);
    if constexpr (kWhole) {
      return _mm512_max_ps(so_far, x);
    } else {
      return _mm512_mask_max_ps(so_far, valid(i, r), so_far, x);
    }
  };
  // Two keys apart, so that eight maxima's steps overlap.
  __m512 maxima[2][kVectors];
  for (int i = 0; i < kVectors; ++i) maxima[0][i] = maxima[1][i] = run.max[i];
  int64_t r = 0;
  for (; r + 2 <= count; r += 2) {
    for (int i = 0; i < kVectors; ++i) {
      maxima[0][i] = max_of(maxima[0][i], i, r);
      maxima[1][i] = max_of(maxima[1][i], i, r + 1);
    }
  }
  if (r < count) {
    for (int i = 0; i < kVectors; ++i)
      maxima[0][i] = max_of(maxima[0][i], i, r);
  }
  for (int i = 0; i < kVectors; ++i) {
    const __m512 block_max = _mm512_max_ps(maxima[0][i], maxima[1][i]);
    // (NaN compares false: it reaches the output through its exponential.)
    const __mmask16 moved =
        _mm512_cmp_ps_mask(block_max, run.max[i], _CMP_GT_OQ);
    if (moved == 0) continue;
    // exp(-inf - finite) == 0: the first block rescales nothing.
    const __m512 correction = _mm512_mask_blend_ps(
        moved, _mm512_set1_ps(1.0f),
        ExpOf16(_mm512_mul_ps(_mm512_sub_ps(run.max[i], block_max), scale)));
    run.sum[i] = _mm512_mul_ps(run.sum[i], correction);
    for (int64_t c = 0; c < dv; ++c) {
      float* acc = &accumulators[c][i * kLanes];
      _mm512_store_ps(acc, _mm512_mul_ps(_mm512_load_ps(acc), correction));
    }
    run.max[i] = _mm512_mask_mov_ps(run.max[i], moved, block_max);
  }
  // One key's row of 64 queries a step: its four vectors' exponentials
  // interleaved (ExpOf64), in place.
  for (int64_t key = 0; key < count; ++key) {
    float* row = &scores[key][0];
    __m512 e[kVectors];
    for (int i = 0; i < kVectors; ++i) {
      e[i] = _mm512_mul_ps(
          _mm512_sub_ps(_mm512_load_ps(row + i * kLanes), run.max[i]), scale);
    }
    ExpOf64(e);
    for (int i = 0; i < kVectors; ++i) {
      if constexpr (!kWhole) e[i] = _mm512_maskz_mov_ps(valid(i, key), e[i]);
      run.sum[i] = _mm512_add_ps(run.sum[i], e[i]);
      _mm512_store_ps(row + i * kLanes, e[i]);
    }
  }
}

// Rows [q0, q0 + rows) of head bh (rows <= kGroupRows) into `group`: Q^T,
// 16 x 16 blocks transposed, and the limits (0 past the rows); `run` set
// out. Returns the end of the keys any of its queries attends to, and sets
// `start` to the end of those all of them do.
int64_t SetOut(const AttentionParams& p, int64_t bh, int64_t q0, int64_t rows,
               QueryGroup& group, Running& run, int64_t& start) {
  const int64_t d = p.d;
  const float* q = p.q + (bh * p.lq + q0) * d;
  for (int64_t c0 = 0; c0 < d; c0 += kLanes) {
    const __mmask16 columns = FirstLanes(d - c0);
    for (int i = 0; i < kVectors; ++i) {
      __m512i block[16];
      for (int64_t n = 0; n < kLanes; ++n) {
        const int64_t row = i * kLanes + n;
        block[n] = row < rows
                       ? _mm512_maskz_loadu_epi32(columns, q + row * d + c0)
                       : _mm512_setzero_si512();
      }
      TransposeWords16x16(block);
      for (int64_t c = 0; c < std::min<int64_t>(kLanes, d - c0); ++c) {
        _mm512_store_si512(&group.queries[c0 + c][i * kLanes], block[c]);
      }
    }
  }
  const int64_t b = bh / p.heads;
  int64_t end = 0;
  start = p.lk;
  for (int64_t r = 0; r < kGroupRows; ++r) {
    const int64_t limit = r < rows ? p.KeyLimit(b, q0 + r) : 0;
    group.limit[r] = static_cast<int32_t>(limit);
    end = std::max(end, limit);
    start = std::min(start, limit);
  }
  const int64_t dvp = (p.dv + kLanes - 1) / kLanes * kLanes;
  std::fill(&group.acc[0][0], &group.acc[0][0] + dvp * kGroupRows, 0.0f);
  for (int i = 0; i < kVectors; ++i) {
    run.max[i] = _mm512_set1_ps(kNegativeInfinity);
    run.sum[i] = _mm512_setzero_ps();
    run.limit[i] = _mm512_load_si512(group.limit + i * kLanes);
  }
  return end;
}

// out[0, rows) = O / sum, O^T transposed back, every value written probed
// (softmax_avx512.h's WriteTransposedOut).
void WriteOut(const AttentionParams& p, const QueryGroup& group,
              const Running& run, int64_t rows, float* out, __m512& probe) {
  for (int i = 0; i < kVectors && i * kLanes < rows; ++i) {
    WriteTransposedOut(&group.acc[0][i * kLanes], kGroupRows, run.sum[i],
                       rows - i * kLanes, p.dv, out + i * kLanes * p.dv, probe);
  }
}

// One task: rows [q0, q0 + rows) of head bh, in groups of 64 that take
// each block of keys and values in turn (so that a block read from memory
// serves every group while it is in cache). Returns whether every output
// it wrote is finite.
bool ColumnsTask(const AttentionParams& p, int64_t bh, int64_t q0, int64_t rows,
                 ColumnsScratch& s) {
  const int64_t d = p.d, dv = p.dv;
  const float* k = p.k + bh * p.lk * d;
  const float* v = p.v + bh * p.lk * dv;
  const int64_t groups = (rows + kGroupRows - 1) / kGroupRows;
  Running run[kGroups];
  int64_t group_end[kGroups], group_start[kGroups];
  int64_t key_end = 0;
  for (int64_t g = 0; g < groups; ++g) {
    group_end[g] = SetOut(p, bh, q0 + g * kGroupRows,
                          std::min(kGroupRows, rows - g * kGroupRows),
                          s.groups[g], run[g], group_start[g]);
    key_end = std::max(key_end, group_end[g]);
  }
  for (int64_t j0 = 0; j0 < key_end; j0 += kBlock) {
    for (int64_t g = 0; g < groups; ++g) {
      if (group_end[g] <= j0) continue;
      QueryGroup& group = s.groups[g];
      const int64_t count = std::min(kBlock, group_end[g] - j0);
      InTiles(count, [&](auto tile_rows, int64_t row) {
        ScoreRows<decltype(tile_rows)::value>(
            k + (j0 + row) * d, d, &group.queries[0][0], &s.scores[row][0]);
      });
      // Where every query attends to the whole block, no key needs its
      // mask.
      if (group_start[g] >= j0 + count) {
        BlockSoftmax<true>(p.scale, j0, count, dv, run[g], s.scores, group.acc);
      } else {
        BlockSoftmax<false>(p.scale, j0, count, dv, run[g], s.scores,
                            group.acc);
      }
      InTiles(dv, [&](auto tile_rows, int64_t channel) {
        PoolRows<decltype(tile_rows)::value>(v + j0 * dv + channel, dv, count,
                                             &s.scores[0][0],
                                             &group.acc[channel][0]);
      });
    }
  }
  float* out = p.out + (bh * p.lq + q0) * dv;
  __m512 probe = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    WriteOut(p, s.groups[g], run[g],
             std::min(kGroupRows, rows - g * kGroupRows),
             out + g * kGroupRows * dv, probe);
  }
  return _mm512_cmp_ps_mask(probe, _mm512_setzero_ps(), _CMP_NEQ_UQ) == 0;
}

bool Takes(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  return p.precision == Precision::kFloat32 && p.k != nullptr &&
         p.weights == nullptr && p.log_sum_exp == nullptr &&
         p.score == ScoreKind::kDotProduct && p.d <= kMaxDepth &&
         p.dv <= kMaxDepth && p.lq >= kMinRows;
}

absl::Status Run(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  const int64_t bh = p.batch * p.heads;
  const int64_t blocks = (p.lq + kTaskRows - 1) / kTaskRows;
  std::atomic<bool> nonfinite{false};
  ForEachItem(
      bh * blocks, call.threads,
      [] { return std::make_unique<ColumnsScratch>(); },
      [&](int64_t index, std::unique_ptr<ColumnsScratch>& scratch) {
        const int64_t head = index / blocks;
        const int64_t q0 = index % blocks * kTaskRows;
        if (!ColumnsTask(p, head, q0, std::min(kTaskRows, p.lq - q0),
                         *scratch)) {
          nonfinite.store(true, std::memory_order_relaxed);
        }
        return true;
      });
  // The engine's output scan (AttentionParams::outputs_finite): every
  // output written was probed.
  if (!nonfinite.load() && p.outputs_finite != nullptr) {
    *p.outputs_finite = true;
  }
  return absl::OkStatus();
}

}  // namespace

const CpuImplementation<AttentionParams> kColumns = {"cpu-columns", Takes, Run};

#else  // no AVX-512 kernel in this copy

namespace {
bool Takes(const CpuCall<AttentionParams>&) { return false; }
absl::Status Run(const CpuCall<AttentionParams>&) {
  return absl::InternalError("cpu-columns: not in this copy");
}
}  // namespace

const CpuImplementation<AttentionParams> kColumns = {"cpu-columns", Takes, Run};

#endif  // ATTN_ISA_AVX512

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
