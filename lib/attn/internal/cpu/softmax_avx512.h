// The softmax's vector arithmetic written for AVX-512, for the avx512 copy's
// kernels (cpu-amx-blocks, cpu-fused-blocks' float32 rows, and the column
// kernels cpu-columns and cpu-amx-columns, with their transposes): the same
// exponential as vec_math.h (its polynomial, exactly 0 below -87, NaN
// kept), four vectors interleaved step by step, 2^n by VSCALEFPS, and row
// maxima and sums reduced once per row. vec_math.h's generic loops reduce a
// row's sum lane by lane at the end of every call: at 256 keys a row that
// cost about a third of the exponentials.
//
// Internal to the kernel sources: include it inside the ISA region
// (attn/internal/isa.h) after vec_math.h, with <immintrin.h> included before
// the region; it defines nothing outside the avx512 copy.
#ifndef ATTN_INTERNAL_CPU_SOFTMAX_AVX512_H_
#define ATTN_INTERNAL_CPU_SOFTMAX_AVX512_H_

#include <algorithm>
#include <cstdint>

#include "attn/internal/isa.h"
#include "attn/internal/vec_math.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
#if defined(ATTN_ISA_AVX512)

using Words16 = uint32_t __attribute__((vector_size(64)));

// The largest and the sum of 16 lanes, halves folded onto each other.
inline float MaxOfLanes(__m512 lanes) {
  __m256 half = _mm256_max_ps(_mm512_castps512_ps256(lanes),
                              _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(
                                  0xf, _mm512_castps_pd(lanes), 1)));
  __m128 quarter = _mm_max_ps(_mm256_castps256_ps128(half),
                              _mm256_extractf128_ps(half, 1));
  quarter = _mm_max_ps(quarter, _mm_movehl_ps(quarter, quarter));
  quarter = _mm_max_ss(quarter, _mm_movehdup_ps(quarter));
  return _mm_cvtss_f32(quarter);
}

inline float SumOfLanes(__m512 lanes) {
  __m256 half = _mm256_add_ps(_mm512_castps512_ps256(lanes),
                              _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(
                                  0xf, _mm512_castps_pd(lanes), 1)));
  __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half),
                              _mm256_extractf128_ps(half, 1));
  quarter = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  quarter = _mm_add_ss(quarter, _mm_movehdup_ps(quarter));
  return _mm_cvtss_f32(quarter);
}

// rows[j] = the j-th 32-bit word of every row, for a 16 x 16 matrix of
// words (the column kernels' queries and outputs, cpu-amx-columns' values):
// unpacks within 128-bit lanes, then lanes moved across registers (64
// shuffles, in place of a gather per column).
inline void TransposeWords16x16(__m512i (&rows)[16]) {
  __m512i pairs[16], quads[16];
  for (int i = 0; i < 16; i += 2) {
    pairs[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    pairs[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  // quads[4g + k], 128-bit lane L: word 4L + k of rows 4g..4g+3.
  for (int g = 0; g < 16; g += 4) {
    quads[g] = _mm512_unpacklo_epi64(pairs[g], pairs[g + 2]);
    quads[g + 1] = _mm512_unpackhi_epi64(pairs[g], pairs[g + 2]);
    quads[g + 2] = _mm512_unpacklo_epi64(pairs[g + 1], pairs[g + 3]);
    quads[g + 3] = _mm512_unpackhi_epi64(pairs[g + 1], pairs[g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i even_low = _mm512_shuffle_i32x4(quads[k], quads[4 + k], 0x88);
    const __m512i even_high =
        _mm512_shuffle_i32x4(quads[8 + k], quads[12 + k], 0x88);
    const __m512i odd_low = _mm512_shuffle_i32x4(quads[k], quads[4 + k], 0xdd);
    const __m512i odd_high =
        _mm512_shuffle_i32x4(quads[8 + k], quads[12 + k], 0xdd);
    rows[k] = _mm512_shuffle_i32x4(even_low, even_high, 0x88);
    rows[8 + k] = _mm512_shuffle_i32x4(even_low, even_high, 0xdd);
    rows[4 + k] = _mm512_shuffle_i32x4(odd_low, odd_high, 0x88);
    rows[12 + k] = _mm512_shuffle_i32x4(odd_low, odd_high, 0xdd);
  }
}

// The first `count` of 16 lanes (count may be <= 0 or > 16).
inline __mmask16 FirstLanes(int64_t count) {
  if (count <= 0) return 0;
  return count >= 16 ? 0xffff : static_cast<__mmask16>((1u << count) - 1);
}

// The column kernels' output: for 16 queries n < rows, out[n][c] =
// acc[c][n] / sum[n] (0 where sum[n] is not positive: a row with no key),
// c < dv, from O^T's rows of 16 queries (row stride `ld` floats, rows up to
// dv rounded to 16 readable), 16 x 16 blocks transposed back. x * 0 is 0
// for every finite x, so `probe` (+= 0 * each value written) stays 0 while
// every value written is finite.
inline void WriteTransposedOut(const float* acc, int64_t ld, __m512 sum,
                               int64_t rows, int64_t dv, float* out,
                               __m512& probe) {
  alignas(64) float inverse[16];
  const __mmask16 some = _mm512_cmp_ps_mask(sum, _mm512_setzero_ps(),
                                            _CMP_GT_OQ);
  _mm512_store_ps(inverse,
                  _mm512_maskz_div_ps(some, _mm512_set1_ps(1.0f), sum));
  for (int64_t c0 = 0; c0 < dv; c0 += 16) {
    __m512i block[16];
    for (int64_t c = 0; c < 16; ++c) {
      block[c] = _mm512_loadu_si512(acc + (c0 + c) * ld);
    }
    TransposeWords16x16(block);
    const __mmask16 columns = FirstLanes(dv - c0);
    for (int64_t n = 0; n < std::min<int64_t>(rows, 16); ++n) {
      const __m512 value = _mm512_mul_ps(reinterpret_cast<__m512>(block[n]),
                                         _mm512_set1_ps(inverse[n]));
      probe = _mm512_add_ps(
          probe, _mm512_maskz_mul_ps(columns, value, _mm512_setzero_ps()));
      _mm512_mask_storeu_ps(out + n * dv + c0, columns, value);
    }
  }
}

// exp(x) of 16 arguments (ExpOfNonPositive's: 0 below -87, NaN kept).
inline __m512 ExpOf16(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.0f);
  const __mmask16 kept = _mm512_cmp_ps_mask(x, floor, _CMP_NLT_UQ);
  return _mm512_maskz_mov_ps(
      kept, ExpInRangeOf<__m512, Words16>(_mm512_max_ps(floor, x)));
}

// x[i] = exp(x[i]) for four vectors of arguments, interleaved step by step
// (one vector at a time, each exponential's chain of dependent steps left
// the out-of-order window too little to overlap); vec_math.h's
// ExpInRangeOf spelt out, its 2^n by VSCALEFPS (exact, as the exponent
// bits' product is, one instruction for three).
inline void ExpOf64(__m512 (&x)[4]) {
  constexpr int kWays = 4;
  const __m512 floor = _mm512_set1_ps(-87.0f);
  const __m512 round_shift = _mm512_set1_ps(12582912.0f);
  __m512 clamped[kWays], n[kWays], r[kWays], p[kWays];
  __mmask16 kept[kWays];
  for (int i = 0; i < kWays; ++i) {
    kept[i] = _mm512_cmp_ps_mask(x[i], floor, _CMP_NLT_UQ);
    clamped[i] = _mm512_max_ps(floor, x[i]);
  }
  for (int i = 0; i < kWays; ++i) {
    n[i] = _mm512_sub_ps(
        _mm512_fmadd_ps(clamped[i], _mm512_set1_ps(1.44269504088896341f),
                        round_shift),
        round_shift);
  }
  for (int i = 0; i < kWays; ++i) {
    r[i] = _mm512_fnmadd_ps(n[i], _mm512_set1_ps(0.693359375f), clamped[i]);
  }
  for (int i = 0; i < kWays; ++i) {
    r[i] = _mm512_fmadd_ps(n[i], _mm512_set1_ps(2.12194440e-4f), r[i]);
  }
  for (int i = 0; i < kWays; ++i) p[i] = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                        1.6666665459e-1f, 5.0000001201e-1f}) {
    for (int i = 0; i < kWays; ++i) {
      p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(c));
    }
  }
  for (int i = 0; i < kWays; ++i) {
    // p * r * r + r + 1, times 2^n.
    p[i] = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(p[i], r[i]), r[i], r[i]),
        _mm512_set1_ps(1.0f));
    x[i] = _mm512_maskz_scalef_ps(kept[i], p[i], n[i]);
  }
}

// 2^t of 16 arguments, for exponentials that are rounded to bfloat16 next
// (cpu-amx-blocks' probabilities, 2^-8 apart): a degree-4 polynomial of the
// fraction (a near-minimax fit of 2^f on [-1/2, 1/2], 2.7e-6 relative, where
// ExpOf16 spends a degree-7 one and a two-step reduction on float's last
// bits), 2^n by VSCALEFPS: 11 instructions where ExpOf16 takes 15. Within
// kExp2ForBFloat16Error of the exact value for t in [-125.5, 128); below
// -125.5 it gives 2^-125.5 (normal, so no step of it is slow), NaN stays
// NaN, and t past 128 gives infinity.
inline constexpr double kExp2ForBFloat16Error = 0x1p-18;

inline __m512 Exp2Of16(__m512 t) {
  // max(floor, t) returns its second operand when either is NaN.
  const __m512 clamped = _mm512_max_ps(_mm512_set1_ps(-125.5f), t);
  const __m512 n = _mm512_roundscale_ps(
      clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(clamped, n);  // exact, in [-1/2, 1/2]
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(9.570102207362652e-3f), f,
                             _mm512_set1_ps(5.591786280274391e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.40247443318367e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931217908859253e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999992847442627e-1f));
  return _mm512_scalef_ps(p, n);
}

// Exp2Of16 of four vectors in place, interleaved step by step (ExpOf64's
// reason).
inline void Exp2Of64(__m512 (&t)[4]) {
  constexpr int kWays = 4;
  const __m512 floor = _mm512_set1_ps(-125.5f);
  __m512 n[kWays], f[kWays], p[kWays];
  for (int i = 0; i < kWays; ++i) t[i] = _mm512_max_ps(floor, t[i]);
  for (int i = 0; i < kWays; ++i) {
    n[i] = _mm512_roundscale_ps(t[i],
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  for (int i = 0; i < kWays; ++i) f[i] = _mm512_sub_ps(t[i], n[i]);
  for (int i = 0; i < kWays; ++i) {
    p[i] = _mm512_fmadd_ps(_mm512_set1_ps(9.570102207362652e-3f), f[i],
                           _mm512_set1_ps(5.591786280274391e-2f));
  }
  for (const float c : {2.40247443318367e-1f, 6.931217908859253e-1f,
                        9.999992847442627e-1f}) {
    for (int i = 0; i < kWays; ++i) {
      p[i] = _mm512_fmadd_ps(p[i], f[i], _mm512_set1_ps(c));
    }
  }
  for (int i = 0; i < kWays; ++i) t[i] = _mm512_scalef_ps(p[i], n[i]);
}

// max(init, row[0..count)): four maxima apart so that they overlap.
inline float RowMax(const float* row, int64_t count, float init) {
  __m512 maxima[4];
  for (__m512& m : maxima) m = _mm512_set1_ps(init);
  int64_t j = 0;
  for (; j + 64 <= count; j += 64) {
    for (int i = 0; i < 4; ++i) {
      maxima[i] = _mm512_max_ps(maxima[i], _mm512_loadu_ps(row + j + 16 * i));
    }
  }
  for (; j < count; j += 16) {
    const __mmask16 lanes = FirstLanes(count - j);
    maxima[1] = _mm512_mask_max_ps(maxima[1], lanes, maxima[1],
                                   _mm512_maskz_loadu_ps(lanes, row + j));
  }
  return MaxOfLanes(_mm512_max_ps(_mm512_max_ps(maxima[0], maxima[1]),
                                  _mm512_max_ps(maxima[2], maxima[3])));
}

// vec_math.h's ExpShiftedAndSum: row[c] = exp((row[c] - max) * scale) for
// c < count, in place; returns their sum.
inline float ExpShiftedAndSumInPlace(float* row, int64_t count, float max,
                                     float scale) {
  const __m512 shift = _mm512_set1_ps(max);
  const __m512 factor = _mm512_set1_ps(scale);
  __m512 sums[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 64 <= count; j += 64) {
    __m512 x[4];
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16 * i),
                                         shift),
                           factor);
    }
    ExpOf64(x);
    for (int i = 0; i < 4; ++i) {
      _mm512_storeu_ps(row + j + 16 * i, x[i]);
      sums[i % 2] = _mm512_add_ps(sums[i % 2], x[i]);
    }
  }
  for (; j < count; j += 16) {
    const __mmask16 lanes = FirstLanes(count - j);
    const __m512 e = _mm512_maskz_mov_ps(
        lanes, ExpOf16(_mm512_mul_ps(
                   _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, row + j), shift),
                   factor)));
    _mm512_mask_storeu_ps(row + j, lanes, e);
    sums[0] = _mm512_add_ps(sums[0], e);
  }
  return SumOfLanes(_mm512_add_ps(sums[0], sums[1]));
}

#endif  // ATTN_ISA_AVX512
}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_SOFTMAX_AVX512_H_
