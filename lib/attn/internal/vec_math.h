// Branch-free float math (bit casts via __builtin_bit_cast, which GCC
// vectorizes where std::memcpy blocks it) that GCC auto-vectorizes in
// `#pragma omp simd` loops. Internal to the CPU kernels: include it inside a
// kernel source's ISA region (attn/internal/isa.h), so that each instruction
// set's copy gets its own.
#ifndef ATTN_INTERNAL_VEC_MATH_H_
#define ATTN_INTERNAL_VEC_MATH_H_

#include <cstdint>

#include "attn/internal/isa.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// exp(clamped) for clamped in [-87, 88] or NaN: Cephes' polynomial after a
// ln2 range reduction, to about 2 ulp. F is float, or a GCC vector of floats
// with U the vector of uint32_t of its size (the lane kernels').
template <typename F, typename U = uint32_t>
inline F ExpInRangeOf(F clamped) {
  // Round clamped / ln2 to the nearest integer with the 1.5 * 2^23 trick.
  const float kShift = 12582912.0f;
  const F shifted = clamped * 1.44269504088896341f + kShift;
  const F n = shifted - kShift;
  // The low mantissa bits of `shifted` hold n as an integer. Unsigned
  // arithmetic: for a NaN input the bits are garbage, and a signed shift of
  // them below would be undefined behaviour (the result is NaN anyway, from
  // p); for every other input n + 127 is in [1, 254].
  const U exponent = __builtin_bit_cast(U, shifted) -
                     __builtin_bit_cast(uint32_t, kShift);
  const F r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * __builtin_bit_cast(F, (exponent + 127u) << 23);
}

inline float ExpInRange(float clamped) { return ExpInRangeOf(clamped); }

// exp(x) to about 2 ulp on [-87, 88]; exactly 0 below -87, so exp(-inf) == 0
// and a masked score contributes nothing; clamped at exp(88) above.
inline float FastExp(float x) {
  const float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  return x < -87.0f ? 0.0f : ExpInRange(clamped);
}

// exp(x) for the softmax sweeps' arguments, x = (score - row max) * scale
// <= 0: FastExp without its upper clamp. Exactly 0 below -87 as FastExp (a
// weight that underflows is exactly zero: one-hot rows stay one-hot). NaN
// stays NaN (scores that overflowed to infinity give inf - inf, and the
// engine then redoes the call on the reference).
inline float ExpOfNonPositive(float x) {
  const float clamped = x < -87.0f ? -87.0f : x;
  return x < -87.0f ? 0.0f : ExpInRange(clamped);
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error about 1e-7.
inline float FastTanh(float x) { return 1.0f - 2.0f / (FastExp(2.0f * x) + 1.0f); }

// In place: row[c] = exp((row[c] - max) * scale) for c < count; returns
// their sum. The difference is taken before scaling, so the argument's
// rounding error stays relative to |row[c] - max| (scale > 0).
inline float ExpShiftedAndSum(float* row, int64_t count, float max,
                              float scale) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < count; ++c) {
    row[c] = ExpOfNonPositive((row[c] - max) * scale);
    sum += row[c];
  }
  return sum;
}

// bfloat16 (the top half of a float's bits), rounded to nearest, ties to
// even. Only for finite values that round to a finite bfloat16 (the kernels'
// operands are validated so; probabilities are in [0, 1]).
inline uint16_t ToBFloat16(float x) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// out[c] = in[c] * factor for c < count; returns whether every value
// written is finite (x * 0 is exactly 0 for finite x, NaN otherwise): the
// engine's overflow scan of the output, taken as a kernel writes it
// (AttentionParams::outputs_finite).
inline bool ScaleIntoFinite(const float* in, int64_t count, float factor,
                            float* out) {
  float probe = 0.0f;
#pragma omp simd reduction(+ : probe)
  for (int64_t c = 0; c < count; ++c) {
    out[c] = in[c] * factor;
    probe += out[c] * 0.0f;
  }
  return probe == 0.0f;
}

inline float FromBFloat16(uint16_t h) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
}

inline void ToBFloat16(const float* from, int64_t count, uint16_t* to) {
#pragma omp simd
  for (int64_t c = 0; c < count; ++c) to[c] = ToBFloat16(from[c]);
}

// ToBFloat16 of `count` floats, also telling whether any was finite and
// rounded to infinity (|x| from 0x7f7f8000, halfway past bfloat16's
// largest finite value, up to float's largest): the operand range check of
// attn/validate.h, taken by a kernel while it rounds (AttentionParams::
// range_checked). Infinity and NaN are not range errors: they stay what
// they are.
inline bool ToBFloat16PastRange(const float* from, int64_t count,
                                uint16_t* to) {
  uint32_t past = 0;
#pragma omp simd reduction(| : past)
  for (int64_t c = 0; c < count; ++c) {
    const uint32_t magnitude =
        __builtin_bit_cast(uint32_t, from[c]) & 0x7fffffffu;
    past |= static_cast<uint32_t>(magnitude - 0x7f7f8000u < 0x8000u);
    to[c] = ToBFloat16(from[c]);
  }
  return past != 0;
}

// As ExpShiftedAndSum, but the exponentials go to `rounded` as bfloat16 (the
// operand of the next product) while their float sum is returned.
inline float ExpShiftedSumAndRound(const float* row, int64_t count, float max,
                                   float scale, uint16_t* rounded) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < count; ++c) {
    const float e = ExpOfNonPositive((row[c] - max) * scale);
    rounded[c] = ToBFloat16(e);
    sum += e;
  }
  return sum;
}

inline float MaxOf(const float* row, int64_t count, float init) {
  float max = init;
#pragma omp simd reduction(max : max)
  for (int64_t c = 0; c < count; ++c) max = row[c] > max ? row[c] : max;
  return max;
}

inline void Scale(float* row, int64_t count, float factor) {
#pragma omp simd
  for (int64_t c = 0; c < count; ++c) row[c] *= factor;
}

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_VEC_MATH_H_
