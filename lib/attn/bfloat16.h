// bfloat16 and float16 rounding for the opt-in reduced-precision products.
#ifndef ATTN_BFLOAT16_H_
#define ATTN_BFLOAT16_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attn/params.h"

namespace attn {

// Rounds a float to the nearest bfloat16 (ties to even) and returns it widened
// back to float. NaN stays NaN; infinities stay infinite.
inline float RoundToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u) {  // inf or NaN: keep, quiet NaN
    if (bits & 0x007fffffu) bits |= 0x00400000u;
    bits &= 0xffff0000u;
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);
    bits &= 0xffff0000u;
  }
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// The bits of RoundToBFloat16(value): the upper half of its float bits.
inline uint16_t BFloat16Bits(float value) {
  const float rounded = RoundToBFloat16(value);
  uint32_t bits;
  std::memcpy(&bits, &rounded, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

// The float a bfloat16's bits stand for (exact: bfloat16 is float's upper
// half).
inline float WidenBFloat16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Rounds a float to the nearest IEEE float16 (ties to even) and returns it
// widened back to float: 11 significant bits, subnormals below 2^-14 in steps
// of 2^-24, and +-inf from 65520 on (the first value that rounds past 65504).
inline float RoundToFloat16(float value) {
  if (!std::isfinite(value)) return value;
  const float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) {
    return std::copysign(std::numeric_limits<float>::infinity(), value);
  }
  if (magnitude < 6.103515625e-05f) {  // 2^-14: the subnormal range
    constexpr float kQuantum = 5.9604644775390625e-08f;  // 2^-24
    return std::copysign(std::nearbyint(magnitude / kQuantum) * kQuantum,
                         value);
  }
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x0fffu + ((bits >> 13) & 1u);  // drop 13 of 23 mantissa bits
  bits &= 0xffffe000u;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// The value a product operand takes at `precision`.
inline float RoundOperand(float value, Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return RoundToBFloat16(value);
    case Precision::kFloat16:
      return RoundToFloat16(value);
    case Precision::kFloat32:
      break;
  }
  return value;
}

}  // namespace attn

#endif  // ATTN_BFLOAT16_H_
