// Operand rounding for the 16-bit precisions, on values whose correct
// rounding is worked out by hand in the comments.
#include "attn/bfloat16.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace attn {
namespace {

TEST(RoundToFloat16Test, KeepsRepresentableValues) {
  for (float value : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, -65504.0f,
                      6.103515625e-05f /* 2^-14, smallest normal */,
                      5.9604644775390625e-08f /* 2^-24, smallest subnormal */}) {
    EXPECT_EQ(RoundToFloat16(value), value) << value;
  }
  EXPECT_TRUE(std::signbit(RoundToFloat16(-0.0f)));
}

TEST(RoundToFloat16Test, RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -10);  // spacing just above 1
  EXPECT_EQ(RoundToFloat16(1.0f + ulp / 2), 1.0f);            // tie -> even
  EXPECT_EQ(RoundToFloat16(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);  // tie -> even
  EXPECT_EQ(RoundToFloat16(1.0f + 0.75f * ulp), 1.0f + ulp);
  EXPECT_EQ(RoundToFloat16(-(1.0f + 0.75f * ulp)), -(1.0f + ulp));
  // 2047.5 lies halfway between 2047 and 2048 (spacing 1 there): 2048 is even.
  EXPECT_EQ(RoundToFloat16(2047.5f), 2048.0f);
  // Above 2048 the spacing is 2: 2049 ties to 2048.
  EXPECT_EQ(RoundToFloat16(2049.0f), 2048.0f);
  EXPECT_EQ(RoundToFloat16(2051.0f), 2052.0f);
}

TEST(RoundToFloat16Test, SubnormalsAndOverflow) {
  const float quantum = std::ldexp(1.0f, -24);
  EXPECT_EQ(RoundToFloat16(quantum / 2), 0.0f);              // tie -> 0
  EXPECT_EQ(RoundToFloat16(3 * quantum / 2), 2 * quantum);   // tie -> even
  EXPECT_EQ(RoundToFloat16(0.6f * quantum), quantum);
  EXPECT_EQ(RoundToFloat16(65519.0f), 65504.0f);  // below the halfway point
  EXPECT_TRUE(std::isinf(RoundToFloat16(65520.0f)));
  EXPECT_LT(RoundToFloat16(-1e9f), 0.0f);
  EXPECT_TRUE(std::isinf(RoundToFloat16(-1e9f)));
  EXPECT_TRUE(std::isnan(RoundToFloat16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(RoundOperandTest, FollowsThePrecision) {
  const float value = 1.0f + std::ldexp(1.0f, -12);
  EXPECT_EQ(RoundOperand(value, Precision::kFloat32), value);
  EXPECT_EQ(RoundOperand(value, Precision::kBFloat16), 1.0f);
  EXPECT_EQ(RoundOperand(value, Precision::kFloat16), 1.0f);
  const float between = 1.0f + std::ldexp(1.0f, -9);  // exact in fp16, not bf16
  EXPECT_EQ(RoundOperand(between, Precision::kFloat16), between);
  EXPECT_EQ(RoundOperand(between, Precision::kBFloat16), 1.0f);
}

}  // namespace
}  // namespace attn
