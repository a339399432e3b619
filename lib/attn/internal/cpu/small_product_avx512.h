// Float32 block products written for AVX-512, for the avx512 copy of the
// attention kernels' products that do not repay a compiled oneDNN
// primitive (a call's 64 x 64 blocks, say; Product() in
// attention_blocks.h). There, dnnl_sgemm packed both operands on every
// call and ran its product at about half the FMA units' rate (float32 B32
// L64 d64, by perf: 51% of the samples in its code).
//
// The product is register-blocked: a tile of up to 6 rows x 64 columns is
// 24 accumulators, each step loads a row of B once and broadcasts one
// element of A per row. Its sums run in float32 along the depth, in order,
// as any float32 product's may.
//
// Internal to the kernel sources: include it inside the ISA region
// (attn/internal/isa.h), with <immintrin.h> included before the region; it
// defines nothing outside the avx512 copy.
#ifndef ATTN_INTERNAL_CPU_SMALL_PRODUCT_AVX512_H_
#define ATTN_INTERNAL_CPU_SMALL_PRODUCT_AVX512_H_

#include <algorithm>
#include <cstdint>

#include "attn/internal/isa.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
#if defined(ATTN_ISA_AVX512)

namespace small_product {

// Rows of a tile, and columns of a panel (four vectors).
inline constexpr int kTileRows = 6;
inline constexpr int64_t kPanelColumns = 64;

inline __mmask16 LeadingLanes(int64_t count) {
  return count >= 16 ? 0xffff : static_cast<__mmask16>((1u << count) - 1);
}

// c[kRows x 16 kVectors] (+)= a[kRows x depth] * b[depth x same], the last
// vector's lanes limited to `last`.
template <int kRows, int kVectors>
inline void Tile(const float* a, int64_t lda, const float* b, int64_t ldb,
                 int64_t depth, float* c, int64_t ldc, bool accumulate,
                 __mmask16 last) {
  // Zeros come from an empty load mask rather than a select, which GCC 12
  // would answer by keeping the accumulators in memory.
  const __mmask16 full = accumulate ? 0xffff : 0;
  const __mmask16 tail = accumulate ? last : 0;
  __m512 acc[kRows][kVectors];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      acc[r][v] = _mm512_maskz_loadu_ps(v == kVectors - 1 ? tail : full,
                                        c + r * ldc + 16 * v);
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    __m512 row[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      row[v] = _mm512_maskz_loadu_ps(v == kVectors - 1 ? last : 0xffff,
                                     b + k * ldb + 16 * v);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) {
        acc[r][v] = _mm512_fmadd_ps(x, row[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v,
                            v == kVectors - 1 ? last : 0xffff, acc[r][v]);
    }
  }
}

template <int kRows>
inline void TileOfWidth(int vectors, const float* a, int64_t lda,
                        const float* b, int64_t ldb, int64_t depth, float* c,
                        int64_t ldc, bool accumulate, __mmask16 last) {
  switch (vectors) {
    case 1:
      return Tile<kRows, 1>(a, lda, b, ldb, depth, c, ldc, accumulate, last);
    case 2:
      return Tile<kRows, 2>(a, lda, b, ldb, depth, c, ldc, accumulate, last);
    case 3:
      return Tile<kRows, 3>(a, lda, b, ldb, depth, c, ldc, accumulate, last);
    default:
      return Tile<kRows, 4>(a, lda, b, ldb, depth, c, ldc, accumulate, last);
  }
}

// Transposes the 16 x 16 floats at `in` (row stride ld_in) into `out` (row
// stride ld_out): three rounds of interleaving, pairs, then 128-bit lanes
// twice.
inline void Transpose16x16(const float* in, int64_t ld_in, float* out,
                           int64_t ld_out) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ld_in);
  for (int i = 0; i < 8; ++i) {  // rows 2i, 2i+1 interleaved
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // pairs of those, 64 bits at a time
    for (int h = 0; h < 2; ++h) {
      const __m512d x = _mm512_castps_pd(t[4 * i + h]);
      const __m512d y = _mm512_castps_pd(t[4 * i + 2 + h]);
      r[4 * i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
      r[4 * i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
    }
  }
  // r[4i + j] now holds, in each 128-bit lane L, column 4L + j of rows
  // 4i .. 4i + 3. Gather lane L of the four groups into output row 4L + j.
  for (int j = 0; j < 4; ++j) {
    const __m512 lo01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);  // L0,2
    const __m512 hi01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);  // L1,3
    const __m512 lo23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 hi23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    t[j] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);        // lane 0
    t[4 + j] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);    // lane 1
    t[8 + j] = _mm512_shuffle_f32x4(lo01, lo23, 0xdd);    // lane 2
    t[12 + j] = _mm512_shuffle_f32x4(hi01, hi23, 0xdd);   // lane 3
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * ld_out, t[i]);
}

}  // namespace small_product

// out[cols x rows] = the transpose of in[rows x cols] (row strides ld_in
// and ld_out): full 16 x 16 tiles in registers, the edges element by
// element.
inline void TransposeBlock(const float* in, int64_t rows, int64_t cols,
                           int64_t ld_in, float* out, int64_t ld_out) {
  const int64_t full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
  for (int64_t i = 0; i < full_rows; i += 16) {
    for (int64_t j = 0; j < full_cols; j += 16) {
      small_product::Transpose16x16(in + i * ld_in + j, ld_in,
                                    out + j * ld_out + i, ld_out);
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = i < full_rows ? full_cols : 0; j < cols; ++j) {
      out[j * ld_out + i] = in[i * ld_in + j];
    }
  }
}

// c[m x n] (+)= a[m x depth] * b[depth x n], row-major float32 with row
// strides lda, ldb and ldc; `accumulate` adds to c instead of writing it.
inline void SmallProduct(int64_t m, int64_t n, int64_t depth, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float* c,
                         int64_t ldc, bool accumulate) {
  using namespace small_product;
  for (int64_t j0 = 0; j0 < n; j0 += kPanelColumns) {
    const int64_t cols = std::min(kPanelColumns, n - j0);
    const int vectors = static_cast<int>((cols + 15) / 16);
    const __mmask16 last = LeadingLanes(cols - 16 * (vectors - 1));
    const float* panel = b + j0;
    int64_t i0 = 0;
    for (; i0 + kTileRows <= m; i0 += kTileRows) {
      TileOfWidth<kTileRows>(vectors, a + i0 * lda, lda, panel, ldb, depth,
                             c + i0 * ldc + j0, ldc, accumulate, last);
    }
    // The last rows, fewer than a tile's, by their count.
    using RestTile = void (*)(int, const float*, int64_t, const float*,
                              int64_t, int64_t, float*, int64_t, bool,
                              __mmask16);
    static constexpr RestTile kRestTiles[kTileRows] = {
        nullptr,         TileOfWidth<1>, TileOfWidth<2>,
        TileOfWidth<3>, TileOfWidth<4>, TileOfWidth<5>};
    if (i0 < m) {
      kRestTiles[m - i0](vectors, a + i0 * lda, lda, panel, ldb, depth,
                         c + i0 * ldc + j0, ldc, accumulate, last);
    }
  }
}

#endif  // ATTN_ISA_AVX512
}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_SMALL_PRODUCT_AVX512_H_
