#include "attn/fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attn {

LossAndGradient LeaveOneOutLoss(const NadarayaWatsonParams& data,
                                double bandwidth) {
  const int64_t n = data.n_train;
  const double w = bandwidth;
  std::vector<double> squared_distance(n), score(n), probability(n);
  std::vector<double> prediction(data.dy), derivative(data.dy);
  LossAndGradient result;
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = data.x_train + i * data.dx;
    double max_score = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      double sq = 0.0;
      for (int64_t c = 0; c < data.dx; ++c) {
        const double diff = static_cast<double>(xi[c]) - data.x_train[j * data.dx + c];
        sq += diff * diff;
      }
      squared_distance[j] = sq;
      score[j] = -w * w * sq / 2.0;
      if (j != i) max_score = std::max(max_score, score[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      probability[j] = j == i ? 0.0 : std::exp(score[j] - max_score);
      sum += probability[j];
    }
    // d score_j / dw = -w * d_ij^2; its probability-weighted mean:
    double mean_slope = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      probability[j] /= sum;
      mean_slope += probability[j] * -w * squared_distance[j];
    }
    std::fill(prediction.begin(), prediction.end(), 0.0);
    std::fill(derivative.begin(), derivative.end(), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      if (probability[j] == 0.0) continue;
      const double slope = probability[j] * (-w * squared_distance[j] - mean_slope);
      for (int64_t c = 0; c < data.dy; ++c) {
        const double y = data.y_train[j * data.dy + c];
        prediction[c] += probability[j] * y;
        derivative[c] += slope * y;
      }
    }
    for (int64_t c = 0; c < data.dy; ++c) {
      const double error = prediction[c] - data.y_train[i * data.dy + c];
      result.loss += error * error;
      result.gradient += 2.0 * error * derivative[c];
    }
  }
  return result;
}

absl::StatusOr<FitBandwidthResult> FitBandwidth(
    const NadarayaWatsonParams& data, double learning_rate, int epochs,
    const std::function<bool()>& stop_requested) {
  // A step too large for the data's scale sends w off to infinity (or
  // overflows the scores, which then give NaN): the fit has diverged, and
  // no bandwidth it reached means anything. Said so, naming the knob.
  const auto diverged = [&](int epoch, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning_rate: the fit diverged at epoch ", epoch + 1, " of ", epochs,
        " (", what, ") with learning_rate ", learning_rate,
        "; use a smaller learning_rate, or scale x_train and y_train"));
  };
  const auto representable = [](double w) {
    return std::isfinite(w) &&
           std::abs(w) <= std::numeric_limits<float>::max();
  };
  FitBandwidthResult result;
  double w = data.bandwidth;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (stop_requested && stop_requested()) {
      return absl::CancelledError(absl::StrCat(
          "the fit was stopped after ", epoch, " of ", epochs, " epochs"));
    }
    const LossAndGradient step = LeaveOneOutLoss(data, w);
    if (!std::isfinite(step.loss) || !std::isfinite(step.gradient)) {
      return diverged(epoch, "the loss or its gradient is not finite");
    }
    result.loss_per_epoch.push_back(step.loss);
    w -= learning_rate * step.gradient;
    if (!representable(w)) {
      return diverged(epoch, "the bandwidth left float's range");
    }
  }
  // Only w^2 enters the model: report the positive one, which is also the
  // form a saved model must take. Data best fit by the plain mean drives w
  // towards 0, where it would round to a bandwidth of 0 that no model
  // accepts; it stops at float's smallest normal value instead (w^2 is then
  // 0 in float: the kernel is already flat there).
  w = std::max(std::abs(w),
               static_cast<double>(std::numeric_limits<float>::min()));
  result.bandwidth = static_cast<float>(w);
  result.final_loss = LeaveOneOutLoss(data, w).loss;
  if (!std::isfinite(result.final_loss)) {
    return diverged(epochs - 1, "the final loss is not finite");
  }
  return result;
}

}  // namespace attn
