// What the AMX kernels (cpu-amx-blocks, cpu-amx-columns) share: the tile
// configuration, their sizes, and the layouts of bfloat16 operands as tiles.
//
// Internal to the kernel sources: include it inside the ISA region (it
// includes softmax_avx512.h), with <immintrin.h> included before the region;
// it defines nothing outside the avx512 copy.
#ifndef ATTN_INTERNAL_CPU_AMX_TILES_H_
#define ATTN_INTERNAL_CPU_AMX_TILES_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attn/internal/isa.h"
#include "attn/internal/cpu/softmax_avx512.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
#if defined(ATTN_ISA_AVX512)

// The tile instructions, on top of the copy's AVX-512.
#define ATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16")))

// Rows, keys or columns per tile, and bfloat16 summed per tile row.
constexpr int64_t kTileSide = 16;
constexpr int64_t kPairsDepth = 32;
constexpr int64_t kTileWords = kTileSide * kTileSide;  // 32-bit words

inline int64_t RoundUp(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

template <typename Vector>
inline void GrowTo(Vector& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
}

// ldtilecfg's operand: palette 1, eight tiles of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// The task's queries, rows x d, into `to` as rows_padded x dp (zeros past
// them).
inline void PadQueries(const uint16_t* queries, int64_t rows, int64_t d,
                       int64_t rows_padded, int64_t dp, uint16_t* to) {
  for (int64_t r = 0; r < rows_padded; ++r) {
    uint16_t* row = to + r * dp;
    if (r < rows) {
      std::copy(queries + r * d, queries + (r + 1) * d, row);
      std::fill(row + d, row + dp, uint16_t{0});
    } else {
      std::fill(row, row + dp, uint16_t{0});
    }
  }
}

// The same from float32 queries, rounded as ToBFloat16; returns whether an
// element was past bfloat16's range (ToBFloat16PastRange).
inline bool PadQueries(const float* queries, int64_t rows, int64_t d,
                       int64_t rows_padded, int64_t dp, uint16_t* to) {
  bool past_range = false;
  for (int64_t r = 0; r < rows_padded; ++r) {
    uint16_t* row = to + r * dp;
    if (r < rows) {
      past_range |= ToBFloat16PastRange(queries + r * d, d, row);
      std::fill(row + d, row + dp, uint16_t{0});
    } else {
      std::fill(row, row + dp, uint16_t{0});
    }
  }
  return past_range;
}

// Row r of a value tile (cpu-amx-blocks' B operand; transposed, a row of
// cpu-amx-columns' V^T): keys `key` and `key` + 1 of the 16 columns from
// `column` of `values` (rows of dv bfloat16, `columns` of those 16 present),
// the even key in each 32-bit word's low half; keys at or past `count` give
// zeros.
inline __m512i ValuePairs(const uint16_t* values, int64_t count, int64_t dv,
                          int64_t key, int64_t column, __mmask16 columns) {
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  if (columns && key < count) {
    even = _mm256_maskz_loadu_epi16(columns, values + key * dv + column);
  }
  if (columns && key + 1 < count) {
    odd = _mm256_maskz_loadu_epi16(columns, values + (key + 1) * dv + column);
  }
  return _mm512_or_si512(_mm512_cvtepu16_epi32(even),
                         _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
}

// Rows [0, count) of `keys` (rows of d bfloat16, d even) as B tiles of a
// product over d (cpu-amx-blocks' keys for the scores, cpu-amx-columns'
// queries): tile (t, c) holds keys 16t..16t+15 and d's words 16c..16c+15,
// word r of key n at [r][n]. keys_padded / 16 x dp / 32 tiles, zeros past
// count and d.
inline void PackRowsAsBTiles(const uint16_t* keys, int64_t count, int64_t d,
                             int64_t keys_padded, int64_t dp, uint32_t* tiles) {
  const int64_t chunks = dp / kPairsDepth;
  const int64_t words = d / 2;
  for (int64_t t = 0; t < keys_padded / kTileSide; ++t) {
    const int64_t present =
        std::clamp<int64_t>(count - t * kTileSide, 0, kTileSide);
    for (int64_t c = 0; c < chunks; ++c) {
      const __mmask16 columns = FirstLanes(words - c * kTileSide);
      __m512i rows[16];
      for (int64_t n = 0; n < kTileSide; ++n) {
        rows[n] =
            n < present
                ? _mm512_maskz_loadu_epi32(
                      columns, keys + (t * kTileSide + n) * d + c * kPairsDepth)
                : _mm512_setzero_si512();
      }
      TransposeWords16x16(rows);
      uint32_t* tile = tiles + (t * chunks + c) * kTileWords;
      for (int64_t r = 0; r < kTileSide; ++r) {
        _mm512_storeu_si512(tile + r * kTileSide, rows[r]);
      }
    }
  }
}

ATTN_AMX_TARGET inline void LoadTileConfig() {
  TileConfig config;
  for (int tile = 0; tile < 8; ++tile) {
    config.bytes_per_row[tile] = 64;
    config.rows[tile] = kTileSide;
  }
  // Not _tile_loadconfig: GCC 12's operand tells the compiler that only a
  // pointer's 8 bytes are read, so it dropped the stores above.
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

ATTN_AMX_TARGET inline void ReleaseTiles() { _tile_release(); }

#endif  // ATTN_ISA_AVX512
}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_AMX_TILES_H_
