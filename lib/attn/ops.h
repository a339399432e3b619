// The user-facing requests and results of every operation the library serves.
// Shapes are validated by attn/validate.h; the Engine (attn/engine.h) runs them.
//
// Tensors are float32, row-major. Views in a request must stay valid until the
// call that takes the request returns; results own their data.
#ifndef ATTN_OPS_H_
#define ATTN_OPS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attn/params.h"
#include "attn/tensor.h"

namespace attn {

// masked_softmax: x (B, Q, K) over the last axis; valid_lens absent, (B,) or
// (B, Q) with every value in [0, K]. Output has x's shape; positions at or
// beyond the valid length are exactly 0, and a row of valid length 0 is all
// zeros.
struct MaskedSoftmaxRequest {
  TensorView x;
  LengthsView valid_lens;
};

// batch_matmul: a (n, m, k) x b (n, k, p) -> (n, m, p).
struct BatchMatmulRequest {
  TensorView a;
  TensorView b;
  Precision precision = Precision::kFloat32;
};

// Scaled dot-product attention, or the Gaussian score -||q - k||^2 / 2.
// Layouts: queries (B, Lq, d), keys (B, Lk, d), values (B, Lk, v) -> output
// (B, Lq, v); or multi-head (B, H, Lq, d), (B, H, Lk, d), (B, H, Lk, v) ->
// (B, H, Lq, v). valid_lens: absent, (B,) or (B, Lq), the same for every head.
// Weights (B, Lq, Lk) or (B, H, Lq, Lk) only when return_weights is set.
struct AttentionRequest {
  TensorView queries;
  TensorView keys;
  TensorView values;
  LengthsView valid_lens;
  bool causal = false;
  // Multiplies the score. Default: 1/sqrt(d) for the dot product, 1 for the
  // Gaussian score. Must be finite and positive.
  std::optional<float> scale;
  ScoreKind score = ScoreKind::kDotProduct;
  bool return_weights = false;
  // Also return each query row's log-sum-exp (OpResult::log_sum_exp,
  // (B, Lq) or (B, H, Lq)): log sum_j exp(scale * score_j) over the keys the
  // row attends, -inf for a row that attends none. With it, calls over the
  // pieces of one memory merge into the answer over all of them
  // (attn/pieces.h).
  bool return_log_sum_exp = false;
  Precision precision = Precision::kFloat32;
  // Keys and values held as bfloat16 (their bits, row-major, in the shapes
  // of `keys` and `values`, whose data must then be null): a memory stored
  // rounded, which no call then converts. Both or neither; only with
  // precision kBFloat16, whose products round K and V to exactly these
  // values. They must be finite: being large, they are not scanned per call
  // (a server checks a stored memory once, when it loads it).
  const uint16_t* keys_bfloat16 = nullptr;
  const uint16_t* values_bfloat16 = nullptr;
  // The keys and values are a stored memory's, unchanged across calls
  // (attn/held_memory.h), so a device backend may keep them between calls.
  // Only with a batch of 1 and no heads (a memory's layout); must outlive
  // the call.
  const HeldMemory* held = nullptr;
};

// Additive attention: queries (B, Lq, q), keys (B, Lk, k), values (B, Lk, v),
// w_q (h, q), w_k (h, k), w_v (h,) -> output (B, Lq, v); masks and weights as
// for AttentionRequest (no heads, no causal mask).
struct AdditiveAttentionRequest {
  TensorView queries;
  TensorView keys;
  TensorView values;
  TensorView w_q;
  TensorView w_k;
  TensorView w_v;
  LengthsView valid_lens;
  bool return_weights = false;
};

// Nadaraya-Watson prediction. x_train (n,) or (n, dx); y_train (n,) or
// (n, dy); x_query (m,) or (m, dx) with the same dx as x_train. Output (m,)
// when y_train is 1-D, else (m, dy); weights (m, n) on request. bandwidth must
// be finite and positive; 1 is the nonparametric estimate.
struct NadarayaWatsonRequest {
  TensorView x_train;
  TensorView y_train;
  TensorView x_query;
  RegressionKernel kernel = RegressionKernel::kGaussian;
  float bandwidth = 1.0f;
  bool return_weights = false;
};

// Fits the bandwidth w of the parametric Gaussian Nadaraya-Watson model by
// full-batch gradient descent on the summed squared loss
//   L(w) = sum_i (yhat_i(w) - y_i)^2,
// where yhat_i attends over every training point except i (the textbook's
// leave-one-out keys). Needs at least 2 training points.
struct FitBandwidthRequest {
  TensorView x_train;
  TensorView y_train;
  float initial_bandwidth = 1.0f;  // finite, positive
  float learning_rate = 0.5f;      // the textbook's SGD step; finite, positive
  int epochs = 5;                  // in [1, 100000]
  // Polled once per epoch (a fit can run for minutes); when it returns true
  // the fit stops with CANCELLED. May be empty. Called on the fitting thread.
  std::function<bool()> stop_requested;
};

// Every operation's result: the output, the weights when requested (else an
// empty tensor), and what ran it.
struct OpResult {
  Tensor output;
  Tensor weights;
  // Attention's per-row log-sum-exp when requested
  // (AttentionRequest::return_log_sum_exp), else empty.
  Tensor log_sum_exp;
  // The implementation that ran, e.g. "cpu-lane", "onednn-matmul",
  // "reference" (one of its backend's Backend::implementation_names()).
  std::string implementation;
  // The backend it belongs to: "onednn-cpu", "cuda" or "reference". A
  // float32 overflow redone in double says "reference" in both.
  std::string backend;
};

struct FitBandwidthResult {
  float bandwidth = 0.0f;
  // loss_per_epoch[e] is L(w) at the start of epoch e (before its update);
  // final_loss is L(w) at the fitted bandwidth.
  std::vector<double> loss_per_epoch;
  double final_loss = 0.0;
};

const char* RegressionKernelName(RegressionKernel kernel);

}  // namespace attn

#endif  // ATTN_OPS_H_
