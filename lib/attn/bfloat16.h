// bfloat16 rounding for the opt-in reduced-precision products.
#ifndef ATTN_BFLOAT16_H_
#define ATTN_BFLOAT16_H_

#include <cstdint>
#include <cstring>

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

}  // namespace attn

#endif  // ATTN_BFLOAT16_H_
