// cpu-amx-columns: bfloat16 attention without weights on AMX tiles, each
// block's scores taken transposed (keys down, queries across), for 64 query
// rows or more of heads up to 64 (d and dv), keys and values given as
// float32 or held as bfloat16.
//
// Why: cpu-amx-blocks runs its softmax along rows (one query's keys), so
// each row of each block pays its own max and sum reductions, and its blocks
// must be long (256 keys) to repay them; its 32 x 256 scores, their
// probabilities, the block's key and value tiles and the accumulators then
// outgrow L1, and its tile loads wait on L2 (the large case ran 16% faster
// with its value tiles read from L1 instead, 8% with its key tiles). Here a
// task (up to 128 query rows of one batch entry and head: four groups of 32)
// takes the scores as S^T = K Q^T, so a query's running max and sum are
// lanes of vectors and the softmax runs down the keys with no reduction at
// all. Blocks of 64 keys then cost nothing extra, and a block's keys,
// values, scores and probabilities stay in L1 with the accumulators of the
// group at work:
// - the keys are the A operand of the scores as rows of d bfloat16, and the
//   values the A operand of O^T += V^T P^T as V^T in chunks of 32 keys, both
//   laid out once per call; the queries are the B operand (pairs of d down,
//   queries across), laid out once per task;
// - per block and group: S^T (64 keys x 32 queries) on tiles; the
//   probabilities rounded to bfloat16 into P^T, the B operand (two keys'
//   probabilities interleaved per query), with each query's block max; its
//   sum and accumulators rescaled where that passed its max by more than
//   the margin below; then O^T += V^T P^T, channels down, queries across,
//   on tiles loaded from and stored back to L1.
// The arithmetic is that of the other bfloat16 paths: bfloat16 products
// summed in float32, the softmax in float32 with cpu-amx-blocks'
// exponentials (softmax_avx512.h's Exp2Of16 and Exp2Of64), the probabilities
// rounded once, and cpu-amx-blocks' lazy rescaling: a query's exponentials
// are taken from its max so far until a block passes it by more than e^8,
// so at most one rescale per 64 keys, what the error bound allows
// (attn/testing/error_bounds.cc), and in practice one per query. The block's
// max then comes out of the exponentials' pass (taken again where it moved
// that far) instead of a pass of its own: against each block's exact max
// found first, the large case ran 4% and then 5% faster, the long one 6%
// and 9% (one step each, alternating builds, 2 threads).

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
#include <vector>

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
#include "attn/internal/cpu/softmax_avx512.h"
#include "attn/internal/cpu/amx_tiles.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

#if defined(ATTN_ISA_AVX512)
namespace {

// Query rows per task and per group (a pair of 16-query tiles), keys per
// block, and the largest d and dv: four tiles of queries stay loaded for
// the scores, and two passes of 32 channels make the second product. (Tasks
// of 64 rows ran 2-4% slower: a block's keys and values serve half as many
// groups while they are in L1.)
constexpr int64_t kTaskRows = 128;
constexpr int64_t kGroup = 32;
constexpr int64_t kGroups = kTaskRows / kGroup;
constexpr int64_t kBlock = 64;
constexpr int64_t kMaxDepth = 64;
// How far (after scaling) a block's max may pass a query's before the query
// is rescaled to it: exponentials up to e^8 stay far inside float's range.
constexpr float kRescaleMargin = 8.0f;
// Over fewer rows the call's layout costs more than it saves: over 4,096
// keys held as bfloat16, 32 rows ran 0.134 ms against cpu-amx-blocks'
// 0.123, 64 rows level, 128 rows 4% faster (BM_MemoryQuery, one thread,
// 2-core Xeon with AMX).
constexpr int64_t kMinRows = 64;
// The most a call's keys and values take laid out (Takes), in a buffer
// the calling thread keeps.
constexpr int64_t kKeptBytes = int64_t{32} << 20;
// Keys laid out by one worker at a time (a call over one head's many keys
// still spreads its layout over the threads).
constexpr int64_t kLayoutKeys = 1024;

// One task's buffers (per thread, reused).
struct alignas(64) ColumnsScratch {
  uint16_t query_rows[kTaskRows * kMaxDepth];
  uint32_t query_tiles[kGroups][4][kTileWords];  // [group][q tile * chunks + c]
  float scores[kBlock][kGroup];                  // S^T
  uint32_t probabilities[kBlock / kPairsDepth][2][kTileWords];  // P^T tiles
  float acc[kGroups][kMaxDepth][kGroup];                        // O^T
  int32_t limit[kTaskRows];
};

// One batch entry's and head's keys (rows of dp bfloat16) and values (V^T in
// chunks of 32 keys: [chunk][dvp channels][32 keys]), lk_padded keys each.
struct Layout {
  int64_t lk_padded, dp, dvp;
  int64_t Words() const { return lk_padded * (dp + dvp); }  // bfloat16
};

// `count` elements of float32 `from` rounded to bfloat16 (returning whether
// one was past its range), or of bfloat16 `bits` copied.
bool Rounded(const float* from, const uint16_t* bits, int64_t count,
             uint16_t* to) {
  if (bits != nullptr) {
    std::copy(bits, bits + count, to);
    return false;
  }
  return ToBFloat16PastRange(from, count, to);
}

// Keys [first, first + count) of head `bh` rounded (or, held as bfloat16,
// copied) into its layout; the padding past lk is zeros. Returns whether an
// element rounded past bfloat16's range.
bool LayOut(const AttentionParams& p, const Layout& layout, int64_t bh,
            int64_t first, int64_t count, uint16_t* head) {
  bool past_range = false;
  uint16_t* keys = head;
  uint16_t* values = head + layout.lk_padded * layout.dp;
  const bool held = p.k_bfloat16 != nullptr;
  const float* k = held ? nullptr : p.k + bh * p.lk * p.d;
  const float* v = held ? nullptr : p.v + bh * p.lk * p.dv;
  const uint16_t* k_bits = held ? p.k_bfloat16 + bh * p.lk * p.d : nullptr;
  const uint16_t* v_bits = held ? p.v_bfloat16 + bh * p.lk * p.dv : nullptr;
  for (int64_t n = first; n < first + count; ++n) {
    uint16_t* row = keys + n * layout.dp;
    if (n < p.lk) {
      past_range |= Rounded(held ? nullptr : k + n * p.d,
                            held ? k_bits + n * p.d : nullptr, p.d, row);
      std::fill(row + p.d, row + layout.dp, uint16_t{0});
    } else {
      std::fill(row, row + layout.dp, uint16_t{0});
    }
  }
  // V^T, 32 keys at a time: their rows rounded, as pairs of keys per channel
  // (cpu-amx-blocks' value tiles), each 16 x 16 words transposed into rows of
  // one channel's 32 keys.
  alignas(64) uint16_t rounded[kPairsDepth * kMaxDepth];
  for (int64_t chunk = first / kPairsDepth;
       chunk < (first + count) / kPairsDepth; ++chunk) {
    const int64_t key0 = chunk * kPairsDepth;
    const int64_t present = std::clamp<int64_t>(p.lk - key0, 0, kPairsDepth);
    if (present > 0) {
      past_range |= Rounded(held ? nullptr : v + key0 * p.dv,
                            held ? v_bits + key0 * p.dv : nullptr,
                            present * p.dv, rounded);
    }
    for (int64_t ct = 0; ct < layout.dvp / kTileSide; ++ct) {
      const __mmask16 columns = FirstLanes(p.dv - ct * kTileSide);
      __m512i rows[16];
      for (int64_t r = 0; r < kTileSide; ++r) {
        rows[r] =
            ValuePairs(rounded, present, p.dv, 2 * r, ct * kTileSide, columns);
      }
      TransposeWords16x16(rows);
      uint16_t* to =
          values + (chunk * layout.dvp + ct * kTileSide) * kPairsDepth;
      for (int64_t c = 0; c < kTileSide; ++c) {
        _mm512_storeu_si512(to + c * kPairsDepth, rows[c]);
      }
    }
  }
  return past_range;
}

// bfloat16(even) in the low half of each 32-bit lane, bfloat16(odd) in the
// high: two keys' probabilities for 16 queries as one row of a B tile.
// Rounded to nearest even as ToBFloat16 (the exponentials are 0 or normal:
// nothing for the instruction to flush).
ATTN_AMX_TARGET inline __m512i InterleavedPairs(__m512 even, __m512 odd) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11,
                                         26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(
      order, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even)));
}

struct TaskResult {
  bool past_range = false;
  bool nonfinite = false;
};

// One task: rows [q0, q0 + rows) of head bh, over its keys in `head`.
ATTN_AMX_TARGET TaskResult ColumnsTask(const AttentionParams& p,
                                       const Layout& layout,
                                       const uint16_t* head, int64_t bh,
                                       int64_t q0, int64_t rows,
                                       ColumnsScratch& s) {
  TaskResult result;
  const int64_t dp = layout.dp, dvp = layout.dvp;
  const int64_t chunks = dp / kPairsDepth, halves = dvp / kPairsDepth;
  const uint16_t* keys = head;
  const uint16_t* values = head + layout.lk_padded * dp;
  const int64_t groups = (rows + kGroup - 1) / kGroup;

  // Queries as B tiles, limits (0 past the task's rows), state.
  const float* q = p.q + (bh * p.lq + q0) * p.d;
  result.past_range =
      PadQueries(q, rows, p.d, groups * kGroup, dp, s.query_rows);
  // Per group, the end of the keys any of its queries attends to, and of
  // those all of them do.
  int64_t group_end[kGroups], group_start[kGroups];
  std::fill(group_end, group_end + kGroups, int64_t{0});
  std::fill(group_start, group_start + kGroups, p.lk);
  const int64_t b = bh / p.heads;
  for (int64_t r = 0; r < kTaskRows; ++r) {
    const int64_t limit = r < rows ? p.KeyLimit(b, q0 + r) : 0;
    s.limit[r] = static_cast<int32_t>(limit);
    group_end[r / kGroup] = std::max(group_end[r / kGroup], limit);
    group_start[r / kGroup] = std::min(group_start[r / kGroup], limit);
  }
  __m512 max[kGroups][2], sum[kGroups][2];
  for (int64_t g = 0; g < groups; ++g) {
    PackRowsAsBTiles(s.query_rows + g * kGroup * dp, kGroup, dp, kGroup, dp,
                     s.query_tiles[g][0]);
    std::fill(&s.acc[g][0][0], &s.acc[g][0][0] + dvp * kGroup, 0.0f);
    for (int j = 0; j < 2; ++j) {
      max[g][j] = _mm512_set1_ps(kNegativeInfinity);
      sum[g][j] = _mm512_setzero_ps();
    }
  }

  const __m512 factor = _mm512_set1_ps(p.scale * 1.44269504088896341f);
  const __m512 scale = _mm512_set1_ps(p.scale);
  const __m512 margin = _mm512_set1_ps(kRescaleMargin);
  const int64_t key_end = *std::max_element(group_end, group_end + kGroups);
  LoadTileConfig();
  for (int64_t j0 = 0; j0 < key_end; j0 += kBlock) {
    for (int64_t g = 0; g < groups; ++g) {
      if (group_end[g] <= j0) continue;
      // S^T: tiles 4-7 hold the queries (query tile t of chunk c at
      // 4 + 2c + t; PackRowsAsBTiles put it at t * chunks + c), 2-3 a key
      // tile's chunks, 0-1 its scores for the two query tiles.
      _tile_loadd(4, s.query_tiles[g][0], 64);
      _tile_loadd(5, s.query_tiles[g][chunks], 64);
      if (chunks == 2) {
        _tile_loadd(6, s.query_tiles[g][1], 64);
        _tile_loadd(7, s.query_tiles[g][3], 64);
      }
      for (int64_t kt = 0; kt < kBlock / kTileSide; ++kt) {
        const uint16_t* key_rows = keys + (j0 + kt * kTileSide) * dp;
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(2, key_rows, dp * 2);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(1, 2, 5);
        if (chunks == 2) {
          _tile_loadd(3, key_rows + kPairsDepth, dp * 2);
          _tile_dpbf16ps(0, 3, 6);
          _tile_dpbf16ps(1, 3, 7);
        }
        _tile_stored(0, &s.scores[kt * kTileSide][0], kGroup * 4);
        _tile_stored(1, &s.scores[kt * kTileSide][kTileSide], kGroup * 4);
      }
      // The softmax down the keys, 16 queries a vector. Where every query
      // of the group attends to the whole block, no key needs its mask.
      const bool whole = group_start[g] >= j0 + kBlock;
      auto valid = [&](const __m512i& limit, int64_t r) ATTN_AMX_TARGET {
        return whole ? __mmask16{0xffff}
                     : _mm512_cmpgt_epi32_mask(
                           limit,
                           _mm512_set1_epi32(static_cast<int32_t>(j0 + r)));
      };
      __m512i limit[2];
      for (int j = 0; j < 2; ++j) {
        limit[j] = _mm512_loadu_si512(s.limit + g * kGroup + j * kTileSide);
      }
      // Two keys' rows of 32 queries a step: four vectors of exponentials
      // from max[g] interleaved step by step (softmax_avx512.h's
      // Exp2Of64), rounded into P^T; their sums, and the block's max.
      auto exponentials = [&](__m512(&block_sum)[2],
                              __m512(&block_max)[2]) ATTN_AMX_TARGET {
        for (int j = 0; j < 2; ++j) {
          block_sum[j] = _mm512_setzero_ps();
          block_max[j] = max[g][j];
        }
        for (int64_t r = 0; r < kBlock; r += 2) {
          __m512 x[4], e[4];
          for (int64_t i = 0; i < 4; ++i) {
            const int64_t key = r + i / 2, j = i % 2;
            x[i] = _mm512_loadu_ps(&s.scores[key][j * kTileSide]);
            e[i] = _mm512_mul_ps(_mm512_sub_ps(x[i], max[g][j]), factor);
          }
          Exp2Of64(e);
          for (int64_t i = 0; i < 4; ++i) {
            const __mmask16 lanes = valid(limit[i % 2], r + i / 2);
            e[i] = _mm512_maskz_mov_ps(lanes, e[i]);
            block_max[i % 2] = _mm512_mask_max_ps(block_max[i % 2], lanes,
                                                  block_max[i % 2], x[i]);
          }
          for (int j = 0; j < 2; ++j) {
            block_sum[j] =
                _mm512_add_ps(block_sum[j], _mm512_add_ps(e[j], e[2 + j]));
            _mm512_storeu_si512(
                &s.probabilities[r / kPairsDepth][j]
                                [(r % kPairsDepth) / 2 * kTileSide],
                InterleavedPairs(e[j], e[2 + j]));
          }
        }
      };
      // Lazy rescaling (cpu-amx-blocks'): a query keeps its max until a
      // block passes it by more than kRescaleMargin after scaling, so its
      // exponentials stay below e^8. So the block's max comes out of the
      // exponentials' pass, and only where it passed a query's max by more
      // is that query rescaled and the pass taken again; a query's first
      // block (its max still -inf) needs its max first. (NaN compares
      // false: it reaches the output through its exponential.)
      __m512 block_max[2], block_sum[2];
      bool first = false;
      for (int j = 0; j < 2; ++j) {
        const __mmask16 attending = _mm512_cmpgt_epi32_mask(
            limit[j], _mm512_set1_epi32(static_cast<int32_t>(j0)));
        first |= _mm512_mask_cmp_ps_mask(attending, max[g][j],
                                         _mm512_set1_ps(kNegativeInfinity),
                                         _CMP_EQ_OQ) != 0;
      }
      if (first) {
        for (int j = 0; j < 2; ++j) {
          // Four maxima apart, so that their steps overlap.
          __m512 maxima[4];
          for (__m512& m : maxima) m = max[g][j];
          for (int64_t r = 0; r < kBlock; ++r) {
            maxima[r % 4] = _mm512_mask_max_ps(
                maxima[r % 4], valid(limit[j], r), maxima[r % 4],
                _mm512_loadu_ps(&s.scores[r][j * kTileSide]));
          }
          block_max[j] = _mm512_max_ps(_mm512_max_ps(maxima[0], maxima[1]),
                                       _mm512_max_ps(maxima[2], maxima[3]));
        }
      } else {
        exponentials(block_sum, block_max);
      }
      bool moved_any = false;
      for (int j = 0; j < 2; ++j) {
        const __mmask16 moved = _mm512_cmp_ps_mask(
            _mm512_mul_ps(_mm512_sub_ps(block_max[j], max[g][j]), scale),
            margin, _CMP_GT_OQ);
        if (moved == 0) continue;
        moved_any = true;
        const __m512 correction = _mm512_mask_blend_ps(
            moved, _mm512_set1_ps(1.0f),
            Exp2Of16(
                _mm512_mul_ps(_mm512_sub_ps(max[g][j], block_max[j]), factor)));
        sum[g][j] = _mm512_mul_ps(sum[g][j], correction);
        for (int64_t c = 0; c < dvp; ++c) {
          float* acc = &s.acc[g][c][j * kTileSide];
          _mm512_storeu_ps(acc,
                           _mm512_mul_ps(_mm512_loadu_ps(acc), correction));
        }
        max[g][j] = _mm512_mask_mov_ps(max[g][j], moved, block_max[j]);
      }
      if (first || moved_any) exponentials(block_sum, block_max);
      for (int j = 0; j < 2; ++j) {
        sum[g][j] = _mm512_add_ps(sum[g][j], block_sum[j]);
      }
      // O^T += V^T P^T, 32 channels a pass: accumulators in tiles 0-3
      // (channel tile h, query tile t at 2h + t), V^T in 4-5, P^T in 6-7.
      const int64_t block_chunks =
          (std::min(kBlock, group_end[g] - j0) + kPairsDepth - 1) / kPairsDepth;
      for (int64_t h = 0; h < halves; ++h) {
        float* acc = &s.acc[g][h * kPairsDepth][0];
        _tile_loadd(0, acc, kGroup * 4);
        _tile_loadd(1, acc + kTileSide, kGroup * 4);
        _tile_loadd(2, acc + kTileSide * kGroup, kGroup * 4);
        _tile_loadd(3, acc + kTileSide * kGroup + kTileSide, kGroup * 4);
        for (int64_t kc = 0; kc < block_chunks; ++kc) {
          const uint16_t* v =
              values +
              ((j0 / kPairsDepth + kc) * dvp + h * kPairsDepth) * kPairsDepth;
          _tile_loadd(4, v, 64);
          _tile_loadd(5, v + kTileSide * kPairsDepth, 64);
          _tile_loadd(6, s.probabilities[kc][0], 64);
          _tile_loadd(7, s.probabilities[kc][1], 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, acc, kGroup * 4);
        _tile_stored(1, acc + kTileSide, kGroup * 4);
        _tile_stored(2, acc + kTileSide * kGroup, kGroup * 4);
        _tile_stored(3, acc + kTileSide * kGroup + kTileSide, kGroup * 4);
      }
    }
  }
  ReleaseTiles();

  // out = O / sum, O^T transposed back, every value written probed.
  float* out = p.out + (bh * p.lq + q0) * p.dv;
  __m512 probe = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int j = 0; j < 2; ++j) {
      const int64_t first = g * kGroup + j * kTileSide;
      if (first >= rows) break;
      WriteTransposedOut(&s.acc[g][0][j * kTileSide], kGroup, sum[g][j],
                         rows - first, p.dv, out + first * p.dv, probe);
    }
  }
  result.nonfinite =
      _mm512_cmp_ps_mask(probe, _mm512_setzero_ps(), _CMP_NEQ_UQ) != 0;
  return result;
}

// The layout's size for the call, in bytes.
int64_t LayoutBytes(const AttentionParams& p) {
  return p.batch * p.heads * RoundUp(p.lk, kBlock) *
         (RoundUp(p.d, kPairsDepth) + RoundUp(p.dv, kPairsDepth)) * 2;
}

// Up to kKeptBytes of layout: past it (a held memory of millions of keys,
// which cpu-amx-blocks reads a block at a time) each call would copy more
// than it computes on. The same for float32 operands and bfloat16 bits, so
// that both give the same result.
bool Takes(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  return call.cpu.amx_tiles && call.cpu.bfloat16_products &&
         p.precision == Precision::kBFloat16 && p.weights == nullptr &&
         p.log_sum_exp == nullptr && p.score == ScoreKind::kDotProduct &&
         p.d % 2 == 0 && p.d <= kMaxDepth && p.dv % 2 == 0 &&
         p.dv <= kMaxDepth && p.lq >= kMinRows && LayoutBytes(p) <= kKeptBytes;
}

absl::Status Run(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  const Layout layout{RoundUp(p.lk, kBlock), RoundUp(p.d, kPairsDepth),
                      RoundUp(p.dv, kPairsDepth)};
  const int64_t bh = p.batch * p.heads;
  // The keys and values laid out once for every task, in a buffer the
  // calling thread keeps (as cpu-amx-blocks' tiles).
  thread_local AlignedVector<uint16_t> kept;
  GrowTo(kept, bh * layout.Words());
  // (The workers reach the calling thread's buffer through this pointer:
  // `kept` in their code would be their own.)
  uint16_t* const heads = kept.data();
  const int64_t pieces = (layout.lk_padded + kLayoutKeys - 1) / kLayoutKeys;
  std::atomic<bool> past_range{false}, nonfinite{false};
  ParallelFor(bh * pieces, call.threads, [&](int64_t item) {
    const int64_t head = item / pieces, first = item % pieces * kLayoutKeys;
    if (LayOut(p, layout, head, first,
               std::min(kLayoutKeys, layout.lk_padded - first),
               heads + head * layout.Words())) {
      past_range.store(true, std::memory_order_relaxed);
    }
  });
  const int64_t blocks = (p.lq + kTaskRows - 1) / kTaskRows;
  ForEachItem(
      bh * blocks, call.threads,
      [] { return std::make_unique<ColumnsScratch>(); },
      [&](int64_t index, std::unique_ptr<ColumnsScratch>& scratch) {
        const int64_t head = index / blocks;
        const int64_t q0 = index % blocks * kTaskRows;
        const TaskResult task =
            ColumnsTask(p, layout, heads + head * layout.Words(), head, q0,
                        std::min(kTaskRows, p.lq - q0), *scratch);
        if (task.past_range) past_range.store(true, std::memory_order_relaxed);
        if (task.nonfinite) nonfinite.store(true, std::memory_order_relaxed);
        return true;
      });
  // The engine's range check and output scan (AttentionParams::
  // range_checked, outputs_finite): every float32 operand was rounded here,
  // and every output written was probed.
  if (past_range.load()) {
    return absl::OutOfRangeError(
        "an operand rounds past bfloat16's largest finite value");
  }
  if (p.range_checked != nullptr) *p.range_checked = true;
  if (!nonfinite.load() && p.outputs_finite != nullptr) {
    *p.outputs_finite = true;
  }
  return absl::OkStatus();
}

}  // namespace

const CpuImplementation<AttentionParams> kAmxColumns = {"cpu-amx-columns",
                                                        Takes, Run};

#else  // no AMX kernel in this copy

namespace {
bool Takes(const CpuCall<AttentionParams>&) { return false; }
absl::Status Run(const CpuCall<AttentionParams>&) {
  return absl::InternalError("cpu-amx-columns: not in this copy");
}
}  // namespace

const CpuImplementation<AttentionParams> kAmxColumns = {"cpu-amx-columns",
                                                        Takes, Run};

#endif  // ATTN_ISA_AVX512

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
