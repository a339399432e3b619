// cpu-amx-blocks: bfloat16 attention without weights, both products on AMX
// tiles programmed here rather than through oneDNN primitives.
//
// Why: a oneDNN matmul per 128 x 256 block pays, every block, the tile
// configuration, its own re-layout of K and V into the pairs the tile unit
// reads, and a primitive call (docs/kernels.md#amx has the profile). Here a
// task (up to 128 query rows of one batch entry and head) walks its keys in
// blocks of kAmxKeyBlock with FlashAttention's online softmax, as
// cpu-fused-blocks, and:
// - configures the eight tiles once (16 rows x 64 bytes each);
// - copies its queries once into rows padded to whole tiles (32-row
//   groups, zeros past d): the A operand of the scores;
// - reads the keys laid out as the B operand of the scores (each key's d
//   as pairs of bfloat16 in 32-bit words, 16 keys transposed into a tile)
//   and the values as the B operand of the second product (two consecutive
//   keys' values interleaved per column), zeros past the last key, d and
//   dv: laid out once per call where several tasks read the same keys
//   (PackAmxTiles), else a block at a time;
// - per group of 32 rows: scores = Q K^T into memory (2 x 2 tiles of 16 x 16
//   floats, the queries kept in tiles for d <= 64), the online softmax on
//   them in AVX-512 (softmax_avx512.h; lazy rescaling, SoftmaxSteps), its
//   probabilities rounded to bfloat16, zero where masked; then acc += P V
//   in 2 x 2 tiles loaded from acc and stored back, in steps issued during
//   the next group's softmax (PendingPool).
// The arithmetic is that of the other bfloat16 paths: bfloat16 products
// summed in float32, softmax in float32, probabilities rounded once.

// GCC 12's unmasked AVX-512 intrinsics pass _mm512_undefined_*() (a
// variable initialised with itself) as their masked-off source, which
// -Wmaybe-uninitialized reports wherever they inline; nothing undefined is
// read.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
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
#include "attn/internal/cpu/amx_blocks.h"
#include "attn/internal/cpu/kernel_copy.h"
#include "attn/internal/cpu/softmax_avx512.h"
#include "attn/internal/cpu/amx_tiles.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

#if defined(ATTN_ISA_AVX512)
namespace {

// Fewer query rows leave most of each pair of 16-row tiles empty: over
// 262,144 bfloat16 keys 16 rows ran 8% slower than the other paths, 24 as
// fast, 32 5-14% faster (BM_MemoryQuery, 2-core Xeon with AMX).
constexpr int64_t kAmxMinRows = 24;
// Keys per online-softmax step, and query rows whose scores are taken
// together: a 32 x 256 score block (32 KiB) and its bfloat16 probabilities
// stay in L1. (64 keys: per-row overheads and the accumulators' round trips
// through the tiles cost a third more.)
constexpr int64_t kAmxKeyBlock = 256;
// Row strides of the score and probability buffers (the probabilities' a
// little longer than a block: measured 4% faster at 4,096 keys).
constexpr int64_t kScoreStride = kAmxKeyBlock;
constexpr int64_t kProbabilityStride = kAmxKeyBlock + 32;
constexpr int64_t kRowGroup = 32;
// Values [0, count) of `values` (rows of dv bfloat16) as B tiles of the
// second product: tile (kc, ct) holds keys 32kc..32kc+31 and columns
// 16ct..16ct+15, keys 2r and 2r + 1 of column n as the word at [r][n].
// keys_padded / 32 x dvp / 16 tiles, zeros past count and dv.
void PackValues(const uint16_t* values, int64_t count, int64_t dv,
                int64_t keys_padded, int64_t dvp, uint32_t* tiles) {
  const int64_t column_tiles = dvp / kTileSide;
  for (int64_t kc = 0; kc < keys_padded / kPairsDepth; ++kc) {
    for (int64_t ct = 0; ct < column_tiles; ++ct) {
      uint32_t* tile = tiles + (kc * column_tiles + ct) * kTileWords;
      const int64_t column = ct * kTileSide;
      const __mmask16 columns = FirstLanes(dv - column);
      for (int64_t r = 0; r < kTileSide; ++r) {
        _mm512_storeu_si512(
            tile + r * kTileSide,
            ValuePairs(values, count, dv, kc * kPairsDepth + 2 * r, column,
                       columns));
      }
    }
  }
}

// The same from float32 operands, rounded as ToBFloat16 (round to nearest
// even, as every other bfloat16 path) a tile's rows at a time, so that a
// call's keys and values are read once, not rounded into a copy first.
// These return whether an element was past bfloat16's range
// (ToBFloat16PastRange); the bfloat16 ones above have none. (The queries'
// PadQueries is amx_tiles.h's.)
AlignedVector<uint16_t>& RoundedRows() {
  thread_local AlignedVector<uint16_t> rows;
  return rows;
}

bool PackKeys(const float* keys, int64_t count, int64_t d,
              int64_t keys_padded, int64_t dp, uint32_t* tiles) {
  AlignedVector<uint16_t>& rounded = RoundedRows();
  GrowTo(rounded, kTileSide * d);
  const int64_t tile_words = dp / kPairsDepth * kTileWords;
  bool past_range = false;
  for (int64_t t = 0; t < keys_padded / kTileSide; ++t) {
    const int64_t first = t * kTileSide;
    const int64_t n = std::clamp<int64_t>(count - first, 0, kTileSide);
    if (n > 0) {
      past_range |=
          ToBFloat16PastRange(keys + first * d, n * d, rounded.data());
    }
    PackRowsAsBTiles(rounded.data(), n, d, kTileSide, dp,
                     tiles + t * tile_words);
  }
  return past_range;
}

bool PackValues(const float* values, int64_t count, int64_t dv,
                int64_t keys_padded, int64_t dvp, uint32_t* tiles) {
  AlignedVector<uint16_t>& rounded = RoundedRows();
  GrowTo(rounded, kPairsDepth * dv);
  const int64_t chunk_words = dvp / kTileSide * kTileWords;
  bool past_range = false;
  for (int64_t kc = 0; kc < keys_padded / kPairsDepth; ++kc) {
    const int64_t first = kc * kPairsDepth;
    const int64_t n = std::clamp<int64_t>(count - first, 0, kPairsDepth);
    if (n > 0) {
      past_range |=
          ToBFloat16PastRange(values + first * dv, n * dv, rounded.data());
    }
    PackValues(rounded.data(), n, dv, kPairsDepth, dvp,
               tiles + kc * chunk_words);
  }
  return past_range;
}

// Operands of either type: bfloat16 as they are, float32 rounded. Each
// returns whether a float32 element was past bfloat16's range.
template <typename... Args>
bool PadQueriesOf(const Operands& ops, const void* q, Args... args) {
  if (ops.type == BlockOperands::kFloat32) {
    return PadQueries(static_cast<const float*>(q), args...);
  }
  PadQueries(static_cast<const uint16_t*>(q), args...);
  return false;
}
template <typename... Args>
bool PackKeysOf(const Operands& ops, const void* k, Args... args) {
  if (ops.type == BlockOperands::kFloat32) {
    return PackKeys(static_cast<const float*>(k), args...);
  }
  PackRowsAsBTiles(static_cast<const uint16_t*>(k), args...);
  return false;
}
template <typename... Args>
bool PackValuesOf(const Operands& ops, const void* v, Args... args) {
  if (ops.type == BlockOperands::kFloat32) {
    return PackValues(static_cast<const float*>(v), args...);
  }
  PackValues(static_cast<const uint16_t*>(v), args...);
  return false;
}

// scores[r][j] = queries[r] . key j for a group's 32 rows (queries padded
// to dp) and keys_padded keys (a multiple of 32); row stride of scores `ld`.
// Two query tiles by two key tiles of 16 x 16 floats at a time; for d <= 64
// (the common head size) the queries stay in four tiles and each key tile
// costs two loads for its four products, half the general loop's.
ATTN_AMX_TARGET void ScoreTiles(const uint16_t* queries, int64_t dp,
                                const uint32_t* key_tiles, int64_t keys_padded,
                                float* scores, int64_t ld) {
  const int64_t chunks = dp / kPairsDepth;
  const int64_t query_stride = dp * 2, score_stride = ld * 4;
  const uint16_t* upper = queries;
  const uint16_t* lower = upper + kTileSide * dp;
  if (chunks <= 2) {
    _tile_loadd(4, upper, query_stride);
    _tile_loadd(5, lower, query_stride);
    if (chunks == 2) {
      _tile_loadd(6, upper + kPairsDepth, query_stride);
      _tile_loadd(7, lower + kPairsDepth, query_stride);
    }
    for (int64_t kt = 0; kt < keys_padded / kTileSide; ++kt) {
      const uint32_t* keys = key_tiles + kt * chunks * kTileWords;
      float* out = scores + kt * kTileSide;
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(2, keys, 64);
      _tile_dpbf16ps(0, 4, 2);
      _tile_dpbf16ps(1, 5, 2);
      if (chunks == 2) {
        _tile_loadd(3, keys + kTileWords, 64);
        _tile_dpbf16ps(0, 6, 3);
        _tile_dpbf16ps(1, 7, 3);
      }
      _tile_stored(0, out, score_stride);
      _tile_stored(1, out + kTileSide * ld, score_stride);
    }
    return;
  }
  for (int64_t kt = 0; kt < keys_padded / kTileSide; kt += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint32_t* left = key_tiles + kt * chunks * kTileWords;
    const uint32_t* right = left + chunks * kTileWords;
    for (int64_t c = 0; c < chunks; ++c) {
      _tile_loadd(4, upper + c * kPairsDepth, query_stride);
      _tile_loadd(5, lower + c * kPairsDepth, query_stride);
      _tile_loadd(6, left + c * kTileWords, 64);
      _tile_loadd(7, right + c * kTileWords, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* out = scores + kt * kTileSide;
    _tile_stored(0, out, score_stride);
    _tile_stored(1, out + kTileSide, score_stride);
    _tile_stored(2, out + kTileSide * ld, score_stride);
    _tile_stored(3, out + kTileSide * ld + kTileSide, score_stride);
  }
}

// bfloat16(2^((x - shift) * factor)) of 16 scores into `to` (factor is the
// scale times log2(e)), their sum added to `sums` and their max taken into
// `maxima`; lanes not in `lanes` give 0, and NaN stays NaN. The
// exponentials are softmax_avx512.h's Exp2Of16, taken to the precision
// that bfloat16 keeps, not float's. Rounded to nearest even, as ToBFloat16
// (the exponentials are 0 or normal: nothing for the instruction to flush).
ATTN_AMX_TARGET inline void Exponentials(__m512 x, __mmask16 lanes,
                                         __m512 shift, __m512 factor,
                                         uint16_t* to, __m512& sums,
                                         __m512& maxima) {
  maxima = _mm512_mask_max_ps(maxima, lanes, maxima, x);
  const __m512 e = _mm512_maskz_mov_ps(
      lanes, Exp2Of16(_mm512_mul_ps(_mm512_sub_ps(x, shift), factor)));
  sums = _mm512_add_ps(sums, e);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(to),
                      reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
}

// Exponentials as above of 64 unmasked scores, four vectors interleaved
// (softmax_avx512.h's Exp2Of64).
ATTN_AMX_TARGET inline void Exponentials64(const float* row, __m512 shift,
                                           __m512 factor, uint16_t* to,
                                           __m512& sums, __m512& maxima) {
  __m512 x[4];
  for (int i = 0; i < 4; ++i) x[i] = _mm512_loadu_ps(row + 16 * i);
  maxima = _mm512_max_ps(_mm512_max_ps(maxima, _mm512_max_ps(x[0], x[1])),
                         _mm512_max_ps(x[2], x[3]));
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm512_mul_ps(_mm512_sub_ps(x[i], shift), factor);
  }
  Exp2Of64(x);
  for (int i = 0; i < 4; ++i) {
    sums = _mm512_add_ps(sums, x[i]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 16 * i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x[i])));
  }
}

// The second product of one row group, acc[r] += probabilities[r] . values
// for its 32 rows (in 2 x 2 tiles of 16 x 16 floats loaded from acc and
// stored back), cut into steps that the next group's softmax issues between
// its rows: the tile unit then multiplies while the vector units take
// exponentials, where run whole between them it waited for them and they
// for it (7% at 4,096 keys).
class PendingPool {
 public:
  PendingPool() = default;
  PendingPool(const uint16_t* probabilities, const uint32_t* value_tiles,
              int64_t keys_padded, int64_t dvp, float* acc)
      : probabilities_(probabilities),
        value_tiles_(value_tiles),
        acc_(acc),
        dvp_(dvp),
        chunks_(keys_padded / kPairsDepth),
        steps_(dvp / (2 * kTileSide) * chunks_) {}

  // One chunk of 32 keys for one pair of column tiles: its products into
  // tiles 0-3, loaded from acc before the pair's first chunk and stored
  // after its last.
  ATTN_AMX_TARGET void Step() {
    const int64_t ct = done_ / chunks_ * 2, kc = done_ % chunks_;
    const int64_t column_tiles = dvp_ / kTileSide;
    const int64_t probability_stride = kProbabilityStride * 2;
    const int64_t acc_stride = dvp_ * 4;
    float* out = acc_ + ct * kTileSide;
    if (kc == 0) {
      _tile_loadd(0, out, acc_stride);
      _tile_loadd(1, out + kTileSide, acc_stride);
      _tile_loadd(2, out + kTileSide * dvp_, acc_stride);
      _tile_loadd(3, out + kTileSide * dvp_ + kTileSide, acc_stride);
    }
    const uint16_t* upper = probabilities_ + kc * kPairsDepth;
    const uint32_t* left =
        value_tiles_ + (kc * column_tiles + ct) * kTileWords;
    _tile_loadd(4, upper, probability_stride);
    _tile_loadd(5, upper + kTileSide * kProbabilityStride, probability_stride);
    _tile_loadd(6, left, 64);
    _tile_loadd(7, left + kTileWords, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    if (kc == chunks_ - 1) {
      _tile_stored(0, out, acc_stride);
      _tile_stored(1, out + kTileSide, acc_stride);
      _tile_stored(2, out + kTileSide * dvp_, acc_stride);
      _tile_stored(3, out + kTileSide * dvp_ + kTileSide, acc_stride);
    }
    ++done_;
  }

  // Runs steps until rows / kRowGroup of them are done (the softmax calls
  // it before each of its rows; RunTo(kRowGroup) finishes the product).
  ATTN_AMX_TARGET void RunTo(int64_t rows) {
    const int64_t until = steps_ * rows / kRowGroup;
    while (done_ < until) Step();
  }

 private:
  const uint16_t* probabilities_ = nullptr;
  const uint32_t* value_tiles_ = nullptr;
  float* acc_ = nullptr;
  int64_t dvp_ = 0, chunks_ = 0, steps_ = 0, done_ = 0;
};

// The online softmax's step over one key block for a group of 32 rows, in
// AVX-512 (softmax_avx512.h). For row r (scores at scores + r *
// kScoreStride, keys [j0, j0 + count) of which the first limit[r] - j0
// count): its max and sum are updated, its accumulator (acc + r * dvp)
// rescaled where the max moves (lazily, below), and probabilities + r *
// kProbabilityStride gets bfloat16(exp((score - max) * scale)), 0 where
// masked, up to keys_padded. Rows group_rows..kRowGroup get zero
// probabilities (their accumulators stay 0). exp is Exponentials': within
// 2^-15 relative of the exact value with its argument's rounding (the
// bfloat16 bound's exponential term, attn/testing/error_bounds.cc), at
// most 2^-125.5 below -87, NaN kept (an overflowed score then reaches the
// output, and the engine redoes the call). `pending`, the previous group's
// second product, is run a step at a time between the rows, and finished.
ATTN_AMX_TARGET void SoftmaxSteps(const float* scores, int64_t group_rows,
                                  const int64_t* limit, int64_t j0,
                                  int64_t count, int64_t keys_padded,
                                  float scale, float* max, float* sum,
                                  uint16_t* probabilities, float* acc,
                                  int64_t dvp, PendingPool& pending) {
  // A row's exponentials are taken from the max of the blocks before this
  // one (FlashAttention 4's lazy rescaling): the max of this block comes
  // out of the same pass, and only where it passes the old one by more than
  // kRescaleMargin (after scaling) is the row rescaled to it and taken
  // again. Exponentials up to e^8 stay far inside float's range; their
  // arguments' rounding stays within u (|score - max| + the row's range),
  // what the error bound allows, as the old max is one of the row's
  // scores. So the max pass and its reduction, which every row waited for
  // before its exponentials, remain only for a row's first block: those
  // rows' maxima are found first, all together, so that their reductions
  // overlap.
  constexpr float kRescaleMargin = 8.0f;
  int64_t valid[kRowGroup];
  float first_max[kRowGroup];
  for (int64_t r = 0; r < kRowGroup; ++r) {
    const float* row = scores + r * kScoreStride;
    valid[r] =
        r < group_rows ? std::clamp<int64_t>(limit[r] - j0, 0, count) : 0;
    if (valid[r] == 0 || max[r] != kNegativeInfinity) continue;
    first_max[r] = RowMax(row, valid[r], kNegativeInfinity);
  }
  const __m512 factor = _mm512_set1_ps(scale * 1.44269504088896341f);
  // The row's exponentials from `reference` into its probabilities; returns
  // their sum, and the block's max in `block_max`.
  auto exponentials = [&](const float* row, uint16_t* rounded,
                          int64_t row_valid, float reference,
                          float& block_max) ATTN_AMX_TARGET {
    const int64_t whole = row_valid / 16 * 16;
    const __m512 shift = _mm512_set1_ps(reference);
    __m512 sum_pair[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    __m512 maxima = _mm512_set1_ps(kNegativeInfinity);
    int64_t j = 0;
    for (; j + 64 <= whole; j += 64) {
      Exponentials64(row + j, shift, factor, rounded + j,
                     sum_pair[(j / 64) % 2], maxima);
    }
    for (; j < keys_padded; j += 16) {
      const __mmask16 lanes = FirstLanes(row_valid - j);
      Exponentials(_mm512_maskz_loadu_ps(lanes, row + j), lanes, shift,
                   factor, rounded + j, sum_pair[0], maxima);
    }
    block_max = MaxOfLanes(maxima);
    return SumOfLanes(_mm512_add_ps(sum_pair[0], sum_pair[1]));
  };
  for (int64_t r = 0; r < kRowGroup; ++r) {
    pending.RunTo(r + 1);
    const float* row = scores + r * kScoreStride;
    uint16_t* rounded = probabilities + r * kProbabilityStride;
    if (valid[r] == 0) {
      std::fill(rounded, rounded + keys_padded, uint16_t{0});
      continue;
    }
    const bool first = max[r] == kNegativeInfinity;
    const float reference = first ? first_max[r] : max[r];
    float block_max;
    float block_sum =
        exponentials(row, rounded, valid[r], reference, block_max);
    // (NaN compares false: it reaches the output through its exponential.)
    if (!first && (block_max - reference) * scale > kRescaleMargin) {
      const float correction = FastExp((reference - block_max) * scale);
      float* row_acc = acc + r * dvp;
      const __m512 by = _mm512_set1_ps(correction);
      for (int64_t c = 0; c < dvp; c += 16) {
        _mm512_storeu_ps(row_acc + c,
                         _mm512_mul_ps(_mm512_loadu_ps(row_acc + c), by));
      }
      sum[r] *= correction;
      max[r] = block_max;
      block_sum = exponentials(row, rounded, valid[r], block_max, block_max);
    } else {
      max[r] = reference;
    }
    sum[r] += block_sum;
  }
}


}  // namespace

bool AmxBlocksTake(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  return call.cpu.amx_tiles && call.cpu.bfloat16_products &&
         p.precision == Precision::kBFloat16 && p.weights == nullptr &&
         p.d % 2 == 0 && p.dv % 2 == 0 && p.lq >= kAmxMinRows;
}

bool AmxTask(const AttentionParams& p, const Operands& ops, const Task& task,
             AmxScratch& s, const KeyShare* share, const AmxTiles* tiles) {
  const int64_t rows = task.rows;
  const int64_t rows_padded = RoundUp(rows, kRowGroup);
  const int64_t dp = RoundUp(p.d, kPairsDepth);
  const int64_t dvp = RoundUp(p.dv, 2 * kTileSide);
  GrowTo(s.queries, rows_padded * dp);
  if (tiles == nullptr) {
    GrowTo(s.key_tiles, kAmxKeyBlock * dp / 2);
    GrowTo(s.value_tiles, kAmxKeyBlock * dvp / 2);
  }
  GrowTo(s.scores, kRowGroup * kScoreStride);
  GrowTo(s.probabilities, 2 * kRowGroup * kProbabilityStride);
  GrowTo(s.acc, rows_padded * dvp);
  GrowTo(s.max, rows_padded);
  GrowTo(s.sum, rows_padded);
  GrowTo(s.limit, rows);
  if (p.score == ScoreKind::kGaussian) GrowTo(s.norms, kAmxKeyBlock);

  const void* k = ops.At(ops.k, task.bh * p.lk * p.d);
  const void* v = ops.At(ops.v, task.bh * p.lk * p.dv);
  bool past_range =
      PadQueriesOf(ops, ops.At(ops.q, (task.bh * p.lq + task.q0) * p.d),
                   rows, p.d, rows_padded, dp, s.queries.data());
  std::fill(s.acc.begin(), s.acc.begin() + rows_padded * dvp, 0.0f);
  std::fill(s.max.begin(), s.max.begin() + rows_padded, kNegativeInfinity);
  std::fill(s.sum.begin(), s.sum.begin() + rows_padded, 0.0f);

  const int64_t key_end = RowLimits(p, task, s.limit.data());
  const int64_t key_begin = share != nullptr ? share->begin : 0;
  const int64_t scan_end =
      share != nullptr ? std::min(key_end, share->end) : key_end;
  LoadTileConfig();
  for (int64_t j0 = key_begin; j0 < scan_end; j0 += kAmxKeyBlock) {
    const int64_t count = std::min(kAmxKeyBlock, scan_end - j0);
    const int64_t keys_padded = RoundUp(count, kPairsDepth);
    const uint32_t* key_tiles;
    const uint32_t* value_tiles;
    if (tiles != nullptr) {
      // Laid out for the whole call: block j0's tiles are where its keys'
      // would be, 16 keys (scores) or 32 (values) a tile.
      key_tiles =
          tiles->keys + j0 / kTileSide * (dp / kPairsDepth) * kTileWords;
      value_tiles =
          tiles->values + j0 / kPairsDepth * (dvp / kTileSide) * kTileWords;
    } else {
      past_range |= PackKeysOf(ops, ops.At(k, j0 * p.d), count, p.d,
                               keys_padded, dp, s.key_tiles.data());
      past_range |= PackValuesOf(ops, ops.At(v, j0 * p.dv), count, p.dv,
                                 keys_padded, dvp, s.value_tiles.data());
      key_tiles = s.key_tiles.data();
      value_tiles = s.value_tiles.data();
    }
    // 32 rows at a time, so that their scores and probabilities stay in
    // L1. A group's second product runs during the next group's softmax
    // (PendingPool), the last group's after it; the probabilities alternate
    // between two buffers.
    PendingPool pending;
    for (int64_t r0 = 0, group = 0; r0 < rows; r0 += kRowGroup, ++group) {
      const int64_t group_rows = std::min(kRowGroup, rows - r0);
      uint16_t* probabilities =
          s.probabilities.data() + group % 2 * kRowGroup * kProbabilityStride;
      ScoreTiles(s.queries.data() + r0 * dp, dp, key_tiles, keys_padded,
                 s.scores.data(), kScoreStride);
      if (p.score == ScoreKind::kGaussian) {
        SubtractKeyNorms(ops, ops.At(k, j0 * p.d), count, p.d, s.scores.data(),
                         group_rows, kScoreStride, s.norms.data());
      }
      SoftmaxSteps(s.scores.data(), group_rows, s.limit.data() + r0, j0,
                   count, keys_padded, p.scale, s.max.data() + r0,
                   s.sum.data() + r0, probabilities, s.acc.data() + r0 * dvp,
                   dvp, pending);
      pending = PendingPool(probabilities, value_tiles, keys_padded, dvp,
                            s.acc.data() + r0 * dvp);
    }
    pending.RunTo(kRowGroup);
  }
  ReleaseTiles();

  if (share != nullptr) {
    std::copy(s.max.begin(), s.max.begin() + rows, share->max);
    std::copy(s.sum.begin(), s.sum.begin() + rows, share->sum);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(s.acc.begin() + r * dvp, s.acc.begin() + r * dvp + p.dv,
                share->acc + r * p.dv);
    }
    return past_range;
  }
  float* out = p.out + (task.bh * p.lq + task.q0) * p.dv;
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = s.sum[r] > 0.0f ? 1.0f / s.sum[r] : 0.0f;
    if (!ScaleIntoFinite(s.acc.data() + r * dvp, p.dv, inverse,
                         out + r * p.dv)) {
      s.wrote_nonfinite = true;
    }
  }
  return past_range;
}

bool PackAmxTiles(const AttentionParams& p, const Operands& ops, int threads,
                  int64_t max_bytes, AlignedVector<uint32_t>& buffer,
                  std::vector<AmxTiles>& tiles, bool* past_range) {
  const int64_t bh = p.batch * p.heads;
  const int64_t keys_padded = RoundUp(p.lk, kPairsDepth);
  const int64_t dp = RoundUp(p.d, kPairsDepth);
  const int64_t dvp = RoundUp(p.dv, 2 * kTileSide);
  const int64_t key_words = keys_padded * dp / 2;
  const int64_t value_words = keys_padded * dvp / 2;
  if (bh * (key_words + value_words) * 4 > max_bytes) return false;
  GrowTo(buffer, bh * (key_words + value_words));
  tiles.resize(bh);
  std::atomic<bool> past{false};
  ParallelFor(bh, threads, [&](int64_t i) {
    uint32_t* keys = buffer.data() + i * (key_words + value_words);
    uint32_t* values = keys + key_words;
    const bool keys_past = PackKeysOf(ops, ops.At(ops.k, i * p.lk * p.d),
                                      p.lk, p.d, keys_padded, dp, keys);
    const bool values_past =
        PackValuesOf(ops, ops.At(ops.v, i * p.lk * p.dv), p.lk, p.dv,
                     keys_padded, dvp, values);
    if (keys_past || values_past) past.store(true, std::memory_order_relaxed);
    tiles[i] = AmxTiles{keys, values};
  });
  *past_range = past.load();
  return true;
}

#else  // no AMX kernel in this copy

bool AmxBlocksTake(const CpuCall<AttentionParams>&) { return false; }

bool AmxTask(const AttentionParams&, const Operands&, const Task&,
             AmxScratch&, const KeyShare*, const AmxTiles*) {
  return false;
}

bool PackAmxTiles(const AttentionParams&, const Operands&, int, int64_t,
                  AlignedVector<uint32_t>&, std::vector<AmxTiles>&, bool*) {
  return false;
}

#endif  // ATTN_ISA_AVX512

namespace {

absl::Status Run(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  // Float32 inputs are rounded as they are laid out (queries per task, keys
  // and values per tile), not copied rounded first; the Gaussian score's
  // key norms are of the rounded keys, so it takes the rounded copies.
  const bool round_in_place =
      p.k_bfloat16 == nullptr && p.score == ScoreKind::kDotProduct;
  std::optional<AttentionOperands> rounded;
  if (!round_in_place) rounded.emplace(call);
  const Operands ops =
      round_in_place ? Operands{BlockOperands::kFloat32, p.q, p.k, p.v}
                     : rounded->get();
  // Where several tasks read each key (more than one block of query rows),
  // the keys and values are laid out as tiles once for all of them, in a
  // buffer the calling thread keeps (as RoundedOperands' copies). Keys and
  // values held as bfloat16 (a stored memory's) had no copy: theirs is
  // made only up to the kept buffer's size, else each task lays out its own
  // blocks as it goes.
  constexpr int64_t kKeptBytes = int64_t{32} << 20;
  thread_local AlignedVector<uint32_t> kept;
  std::vector<AmxTiles> tiles;
  bool keys_past_range = false;
  if (QueryBlocks(p) > 1) {
    PackAmxTiles(p, ops, call.threads,
                 p.k_bfloat16 != nullptr
                     ? kKeptBytes
                     : std::numeric_limits<int64_t>::max(),
                 kept, tiles, &keys_past_range);
  }
  std::atomic<bool> past_range{keys_past_range}, nonfinite{false};
  ForEachItem(
      TaskCount(p), call.threads, [] { return AmxScratch{}; },
      [&](int64_t index, AmxScratch& scratch) {
        const Task task = TaskAt(p, index);
        if (AmxTask(p, ops, task, scratch, nullptr,
                    tiles.empty() ? nullptr : &tiles[task.bh])) {
          past_range.store(true, std::memory_order_relaxed);
        }
        if (scratch.wrote_nonfinite) {
          nonfinite.store(true, std::memory_order_relaxed);
        }
        return true;
      });
  if (static_cast<int64_t>(kept.size() * sizeof(uint32_t)) > kKeptBytes) {
    AlignedVector<uint32_t>().swap(kept);
  }
  // The engine's range check, where it left it here (AttentionParams::
  // range_checked): the float32 operands rounded in place were checked as
  // they were rounded. That covers the call when every element was: every
  // query (each task rounds its rows), and every key and value, which the
  // call-wide layout rounds, as does each task's own where no row is
  // masked short of the last key.
  if (past_range.load()) {
    return absl::OutOfRangeError(
        "an operand rounds past bfloat16's largest finite value");
  }
  const bool every_key_read =
      !tiles.empty() ||
      (p.valid.kind == ValidLengths::Kind::kNone && !p.causal);
  if (round_in_place && every_key_read && p.range_checked != nullptr) {
    *p.range_checked = true;
  }
  // And the engine's overflow scan of the output: each task checked the
  // rows it wrote.
  if (!nonfinite.load() && p.outputs_finite != nullptr) {
    *p.outputs_finite = true;
  }
  return absl::OkStatus();
}

// Its calls, but for those that ask for the log-sum-exp: cpu-key-shares
// runs those, on these tiles.
bool Takes(const CpuCall<AttentionParams>& call) {
  return call.params.log_sum_exp == nullptr && AmxBlocksTake(call);
}

}  // namespace

const CpuImplementation<AttentionParams> kAmxBlocks = {"cpu-amx-blocks", Takes,
                                                       Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
