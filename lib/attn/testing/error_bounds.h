// Forward error bounds of the float32 kernels, derived from the arithmetic
// rather than measured on one CPU, so that a test passes on every CPU whose
// kernels compute what they claim, and fails on any that computes something
// else.
//
// Notation: u = 2^-24 (float32's unit roundoff), gamma(n) = n u / (1 - n u),
// the classic bound on the relative error of n successive roundings (Higham,
// "Accuracy and Stability of Numerical Algorithms", 3.1). A bound holds for
// any summation order and blocking, with or without FMA, for every
// instruction set a backend may pick.
//
// Softmax rows (every operation but BatchMatmul): for a row with valid
// entries 0..L-1 (L > 0), scores s_j and a bound E on every score's float32
// error (per operation, below):
// - the exact softmax of the perturbed scores is within a factor
//   exp(+-2E) of p_j;
// - evaluating it adds at most gamma(L + 8 nb + 8) + u (|s_j - max| + range)
//   relative: exp arguments and online-softmax rescale arguments rounded (u
//   times their size, at most |s_j - max| + the row's range of scores), a
//   polynomial exp good to 4u, a sum of L terms, nb = ceil(L / 64) rescales,
//   one reciprocal; and flushing exp below e^-87 to 0 at most 2^-120
//   absolute;
// - weights: |dp_j| <= p_j rho_j + 2^-120, rho_j the product of the above;
// - outputs: |do_c| <= sum_j |v_jc| (p_j (rho_j + gamma(L + 2)) + 2^-120),
//   the last gamma for the float sum of L products and the final scaling.
// Masked positions must be exactly 0 (bound 0); rows with L == 0 all zeros.
// The `exact` result each function takes is the reference engine's for the
// same request, with return_weights set where the operation has weights.
#ifndef ATTN_TESTING_ERROR_BOUNDS_H_
#define ATTN_TESTING_ERROR_BOUNDS_H_

#include <cstdint>

#include "attn/ops.h"
#include "attn/tensor.h"
#include "gtest/gtest.h"

namespace attn::testing {

double Gamma(int64_t n);

struct ErrorBounds {
  Tensor weights;  // shape of exact.weights (empty for BatchMatmul)
  Tensor output;   // shape of exact.output
  Tensor log_sum_exp;  // shape of exact.log_sum_exp (attention, if asked)
};

// Scaled dot-product or Gaussian-score attention, at the request's precision
// (operands rounded as the reference rounds them; with bfloat16, the
// probabilities may be rounded to bfloat16 for the product with the values
// as well, which adds sum_j |v_jc| p_j 2^-8 (1 + rho_j) to each output; the
// bfloat16 hardware accumulates in float32, so the gamma terms stay). Score
// error:
// E <= gamma(d + 2) max_j scale (sum_c |q_c k_jc| [+ sum_c k_jc^2 / 2 for the
// Gaussian score, which the kernels compute as q.k - |k|^2 / 2]).
//
// The log-sum-exp l of a row (AttentionRequest::return_log_sum_exp) is
// log sum_j exp(s_j (1 + ...)): off by at most E, plus the evaluation's
// relative error e of its sum (the terms above but the perturbation), as
// e / (1 - e), plus 2^-8 for bfloat16 calls (a kernel may sum the rounded
// probabilities), plus u |l| for its rounding to float (and, for the
// Gaussian score, u scale |q|^2 / 2 for the -|q|^2 / 2 put back in double).
//
// `piece_error`: the answer is a merge of calls over pieces of the keys
// (attn/pieces.h) whose log-sum-exps were each off by at most piece_error.
// A merged weight's factor exp(l_i - L) is then off by exp(2 piece_error),
// and the pieces' weights and outputs were rounded to float before the
// merge (2u): every rho_j grows to (1 + rho_j) exp(2 piece_error) (1 + 2u)
// - 1, outputs alike, and L is off by piece_error + u |L|.
ErrorBounds AttentionBounds(const AttentionRequest& request,
                            const OpResult& exact, double piece_error = 0.0);

// Masked softmax: scores are the inputs, E = 0.
ErrorBounds MaskedSoftmaxBounds(const MaskedSoftmaxRequest& request,
                                const OpResult& exact);

// c = sum_l a_l b_l over k terms: |dc| <= gamma(k + 1) sum_l |a_l b_l| + u |c|
// (operands rounded to the request's precision, as both sides round them).
ErrorBounds BatchMatmulBounds(const BatchMatmulRequest& request,
                              const OpResult& exact);

// Additive attention: feature f_u = (W_q q)_u + (W_k k)_u carries
// gamma(dq) sum |W_q q| + gamma(dk) sum |W_k k| + u |f_u|; tanh (Lipschitz 1)
// passes it through and adds at most 8u; the score sum_u w_v[u] tanh(f_u)
// adds gamma(h + 1) sum_u |w_v[u] tanh(f_u)|.
ErrorBounds AdditiveAttentionBounds(const AdditiveAttentionRequest& request,
                                    const OpResult& exact);

// Nadaraya-Watson. Gaussian: the score -w^2 d^2 / 2 carries
// gamma(dx + 6) of itself, then the softmax rows above. Epanechnikov: a kernel
// value 1 - w d is off by at most gamma(dx + 4) w d + u, and a weight K_j / M
// by (dK_j + p_j sum_l dK_l) / M + gamma(n + 2) p_j. Boxcar and constant:
// kernel values are exactly 0 or 1, so only the normalisation rounds
// (gamma(n + 2) p_j), except for a point within gamma(dx + 4) of the
// boxcar's edge, whose row is then bounded only by 1 (weights) and max |y|.
ErrorBounds NadarayaWatsonBounds(const NadarayaWatsonRequest& request,
                                 const OpResult& exact);

// Passes when shapes match and |actual - expected| <= bound element-wise,
// with NaN or infinity in `actual` failing wherever `expected` is finite.
// The failure names the worst element relative to its bound.
::testing::AssertionResult WithinBounds(const Tensor& actual,
                                        const Tensor& expected,
                                        const Tensor& bound);

}  // namespace attn::testing

#endif  // ATTN_TESTING_ERROR_BOUNDS_H_
