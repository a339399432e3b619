// Forward error bounds of the float32 kernels, derived from the arithmetic
// rather than measured on one CPU, so that a test passes on every CPU whose
// kernels round correctly and fails on any that compute something else.
//
// Notation: u = 2^-24 (float32's unit roundoff), gamma(n) = n u / (1 - n u),
// the classic bound on the relative error of n successive roundings (Higham,
// "Accuracy and Stability of Numerical Algorithms", 3.1). A bound holds for
// any summation order and blocking, with or without FMA, for every
// instruction set a backend may pick.
#ifndef ATTN_TESTING_ERROR_BOUNDS_H_
#define ATTN_TESTING_ERROR_BOUNDS_H_

#include <cstdint>

#include "attn/ops.h"
#include "attn/tensor.h"
#include "gtest/gtest.h"

namespace attn::testing {

double Gamma(int64_t n);

// Per-element bounds on |float32 kernel - exact| for a scaled dot-product (or
// Gaussian-score) attention request, at the request's precision (operands
// rounded as the reference rounds them). `exact` is the reference engine's
// result for the request with return_weights set (its weights are needed).
//
// For a query row with valid keys 0..L-1 (L > 0), scores s_j and their
// float32 error e_j <= gamma(d + 2) * (scale * sum_c |q_c k_jc| [+ scale/2 *
// sum_c k_jc^2 for the Gaussian score, computed as q.k - |k|^2/2]):
// - the exact softmax of the perturbed scores is within a factor
//   exp(+-2 max_j e_j) of p_j;
// - evaluating it (exp argument s_j - max and online-softmax rescale
//   arguments rounded: u (|s_j - max| + range of s); a polynomial exp good to
//   4 u; the sum of L terms; nb = ceil(L / 64) rescales; one reciprocal) adds
//   at most gamma(L + 8 nb + 8) + u (|s_j - max| + range) relative, and
//   flushing exp below e^-87 to 0 at most 2^-120 absolute;
// - weights:  |dp_j| <= p_j rho_j + 2^-120, rho_j the product of the above;
// - outputs:  |do_c| <= sum_j |v_jc| (p_j (rho_j + gamma(L + 2)) + 2^-120),
//   the last gamma for the float sum of L products and the final scaling.
// Masked positions must be exactly 0 (bound 0); rows with L == 0 all zeros.
struct AttentionErrorBounds {
  Tensor weights;  // shape of exact.weights
  Tensor output;   // shape of exact.output
};
AttentionErrorBounds AttentionBounds(const AttentionRequest& request,
                                     const OpResult& exact);

// Passes when shapes match and |actual - expected| <= bound element-wise,
// with NaN or infinity in `actual` failing wherever `expected` is finite.
// The failure names the worst element relative to its bound.
::testing::AssertionResult WithinBounds(const Tensor& actual,
                                        const Tensor& expected,
                                        const Tensor& bound);

}  // namespace attn::testing

#endif  // ATTN_TESTING_ERROR_BOUNDS_H_
