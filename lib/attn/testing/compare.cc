#include "attn/testing/compare.h"

#include <cmath>

namespace attn::testing {

::testing::AssertionResult AllClose(const Tensor& actual,
                                    const Tensor& expected, double abs_tol,
                                    double rel_tol) {
  if (actual.shape != expected.shape) {
    return ::testing::AssertionFailure()
           << "shape " << ShapeToString(actual.shape) << " != expected "
           << ShapeToString(expected.shape);
  }
  double worst_excess = 0.0;
  int64_t worst = -1;
  for (size_t i = 0; i < actual.data.size(); ++i) {
    const double a = actual.data[i];
    const double e = expected.data[i];
    const double allowed = abs_tol + rel_tol * std::fabs(e);
    const double error = std::isfinite(a) ? std::fabs(a - e) : INFINITY;
    if (std::isfinite(e) && error > allowed &&
        (worst < 0 || error - allowed > worst_excess)) {
      worst_excess = error - allowed;
      worst = static_cast<int64_t>(i);
    }
  }
  if (worst >= 0) {
    return ::testing::AssertionFailure()
           << "element " << worst << " of " << ShapeToString(actual.shape)
           << ": got " << actual.data[worst] << ", expected "
           << expected.data[worst] << " (abs_tol " << abs_tol << ", rel_tol "
           << rel_tol << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult AllExactly(const Tensor& actual, float expected,
                                      int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (actual.data[i] != expected) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << actual.data[i] << ", expected "
             << expected << " exactly";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace attn::testing
