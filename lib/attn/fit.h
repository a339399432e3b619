// Fitting the bandwidth of the parametric Nadaraya-Watson model (the
// attention-pooling section's NWKernelRegression) by gradient descent.
//
// The model predicts training point i from every other training point:
//   yhat_i(w) = sum_{j != i} softmax_j(-(w * ||x_i - x_j||)^2 / 2) y_j,
// and the loss is L(w) = sum_i ||yhat_i(w) - y_i||^2 (the textbook sums the
// per-point squared errors). The gradient is exact (analytic), in double.
// Only w^2 enters the model, so the sign of w carries no meaning: the fitted
// bandwidth is returned as |w|.
//
// Pure functions: thread-safe, blocking, O(epochs * n^2 * (dx + dy)) time and
// O(n) memory.
#ifndef ATTN_FIT_H_
#define ATTN_FIT_H_

#include <functional>

#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "attn/params.h"

namespace attn {

// L(w) and dL/dw for the training pairs of `data` (x_train, y_train, n_train,
// dx, dy) at w = `bandwidth`.
struct LossAndGradient {
  double loss = 0.0;
  double gradient = 0.0;
};
LossAndGradient LeaveOneOutLoss(const NadarayaWatsonParams& data,
                                double bandwidth);

// Runs `epochs` full-batch gradient steps from data.bandwidth and returns
// |w|, finite, within float's range and at least its smallest normal value
// (a fit that drives w to 0 stops there). INVALID_ARGUMENT naming
// learning_rate when the descent diverges (w leaves float's range, or the
// loss or gradient is not finite); CANCELLED when `stop_requested` (may be
// empty) returns true before an epoch.
absl::StatusOr<FitBandwidthResult> FitBandwidth(
    const NadarayaWatsonParams& data, double learning_rate, int epochs,
    const std::function<bool()>& stop_requested = {});

}  // namespace attn

#endif  // ATTN_FIT_H_
