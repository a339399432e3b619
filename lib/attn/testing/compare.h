// Tolerance comparisons of an optimized result against the reference.
#ifndef ATTN_TESTING_COMPARE_H_
#define ATTN_TESTING_COMPARE_H_

#include "attn/tensor.h"
#include "gtest/gtest.h"

namespace attn::testing {

// Passes when shapes match and every element satisfies
// |actual - expected| <= abs_tol + rel_tol * |expected|, and no element of
// `actual` is NaN or infinite where `expected` is finite. The failure message
// names the worst element's index and both values.
::testing::AssertionResult AllClose(const Tensor& actual,
                                    const Tensor& expected, double abs_tol,
                                    double rel_tol = 0.0);

// Passes when every element of `actual` equals `expected` exactly (masked
// weights must be exactly 0, not small).
::testing::AssertionResult AllExactly(const Tensor& actual, float expected,
                                      int64_t begin, int64_t end);

}  // namespace attn::testing

#endif  // ATTN_TESTING_COMPARE_H_
