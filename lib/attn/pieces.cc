#include "attn/pieces.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attn/status_macros.h"

namespace attn {
namespace {

std::string Field(size_t piece, const char* field) {
  return absl::StrCat("pieces[", piece, "].", field);
}

// The checks of the header, and the merged weights' width (0 without).
absl::StatusOr<int64_t> CheckPieces(absl::Span<const AttentionPiece> pieces,
                                    int64_t rows) {
  const Shape& output_shape = pieces[0].output.shape;
  const Shape row_shape(output_shape.begin(), output_shape.end() - 1);
  const bool weights = !pieces[0].weights.shape.empty();
  int64_t keys = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const AttentionPiece& piece = pieces[i];
    if (piece.output.shape != output_shape || piece.output.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(i, "output"), ": shape ", ShapeToString(piece.output.shape),
          " must be ", ShapeToString(output_shape), ", as pieces[0]'s"));
    }
    if (piece.log_sum_exp.shape != row_shape ||
        piece.log_sum_exp.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(i, "log_sum_exp"), ": shape ",
          ShapeToString(piece.log_sum_exp.shape), " must be ",
          ShapeToString(row_shape), ", the output's without its last axis"));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float l = piece.log_sum_exp.data[r];
      if (std::isnan(l) || l == std::numeric_limits<float>::infinity()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Field(i, "log_sum_exp"), "[", r, "] is ", l,
            ": must be finite, or -inf for a row with no key"));
      }
    }
    if (piece.weights.shape.empty() != !weights) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(i, "weights"), ": ", weights ? "missing" : "given",
          ": every piece has weights or none does, as pieces[0]"));
    }
    if (!weights) continue;
    const Shape& w = piece.weights.shape;
    if (w.size() != output_shape.size() || piece.weights.data == nullptr ||
        !std::equal(row_shape.begin(), row_shape.end(), w.begin()) ||
        w.back() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(i, "weights"), ": shape ", ShapeToString(w), " must be (",
          absl::StrJoin(row_shape, ", "), ", n) with n >= 1 keys"));
    }
    keys += w.back();
    if (keys > kMaxTensorElements / std::max<int64_t>(rows, 1)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "merged weights of ", rows, " rows by more than ", keys,
          " keys exceed ", kMaxTensorElements, " elements"));
    }
  }
  return keys;
}

}  // namespace

absl::StatusOr<MergedAttention> MergeAttentionPieces(
    absl::Span<const AttentionPiece> pieces) {
  if (pieces.empty()) {
    return absl::InvalidArgumentError("pieces: none to merge (at least one)");
  }
  const Shape& output_shape = pieces[0].output.shape;
  if (output_shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        Field(0, "output"), ": shape ", ShapeToString(output_shape),
        " must be (..., Lq, v)"));
  }
  ASSIGN_OR_RETURN(const int64_t count,
                   CheckedNumElements(Field(0, "output"), output_shape));
  const int64_t dv = output_shape.back();
  const int64_t rows = count / dv;
  ASSIGN_OR_RETURN(const int64_t keys, CheckPieces(pieces, rows));

  MergedAttention merged;
  Shape row_shape(output_shape.begin(), output_shape.end() - 1);
  Shape weights_shape = row_shape;
  weights_shape.push_back(keys);
  try {
    merged.output = Tensor::Uninitialized(output_shape);
    merged.log_sum_exp = Tensor::Uninitialized(row_shape);
    if (keys > 0) merged.weights = Tensor::Uninitialized(weights_shape);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate the merged output ", ShapeToString(output_shape),
        keys > 0 ? absl::StrCat(" and weights ", ShapeToString(weights_shape))
                 : ""));
  }
  std::vector<double> factor(pieces.size()), out(dv);
  for (int64_t r = 0; r < rows; ++r) {
    // L = m + log sum_i exp(l_i - m), m the largest l_i.
    double max = -std::numeric_limits<double>::infinity();
    for (const AttentionPiece& piece : pieces) {
      max = std::max<double>(max, piece.log_sum_exp.data[r]);
    }
    double total = -std::numeric_limits<double>::infinity();
    if (max != -std::numeric_limits<double>::infinity()) {
      double sum = 0.0;
      for (const AttentionPiece& piece : pieces) {
        sum += std::exp(piece.log_sum_exp.data[r] - max);
      }
      total = max + std::log(sum);
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      // exp(-inf - L) is 0, and so is a piece of a row with no key.
      factor[i] = total == -std::numeric_limits<double>::infinity()
                      ? 0.0
                      : std::exp(pieces[i].log_sum_exp.data[r] - total);
    }
    std::fill(out.begin(), out.end(), 0.0);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (factor[i] == 0.0) continue;
      const float* o = pieces[i].output.data + r * dv;
      for (int64_t c = 0; c < dv; ++c) out[c] += factor[i] * o[c];
    }
    for (int64_t c = 0; c < dv; ++c) {
      merged.output.data[r * dv + c] = static_cast<float>(out[c]);
    }
    merged.log_sum_exp.data[r] = static_cast<float>(total);
    if (keys == 0) continue;
    float* w = merged.weights.data.data() + r * keys;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int64_t n = pieces[i].weights.shape.back();
      const float* piece_weights = pieces[i].weights.data + r * n;
      for (int64_t j = 0; j < n; ++j) {
        w[j] = static_cast<float>(factor[i] * piece_weights[j]);
      }
      w += n;
    }
  }
  return merged;
}

absl::StatusOr<OpResult> AttendInPieces(
    Engine& engine, absl::Span<const AttentionRequest> pieces) {
  if (pieces.empty()) {
    return absl::InvalidArgumentError("pieces: at least one is needed");
  }
  std::vector<OpResult> answers;
  answers.reserve(pieces.size());
  size_t largest = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    AttentionRequest call = pieces[i];
    call.return_log_sum_exp = true;
    ASSIGN_OR_RETURN(OpResult answer, engine.ScaledDotProductAttention(call));
    answers.push_back(std::move(answer));
    if (pieces[i].keys.num_elements() > pieces[largest].keys.num_elements()) {
      largest = i;
    }
  }
  if (answers.size() == 1 && pieces.front().return_log_sum_exp) {
    return std::move(answers.front());
  }
  std::vector<AttentionPiece> views;
  views.reserve(answers.size());
  for (const OpResult& answer : answers) {
    views.push_back({answer.output.view(), answer.log_sum_exp.view(),
                     answer.weights.view()});
  }
  ASSIGN_OR_RETURN(MergedAttention merged, MergeAttentionPieces(views));
  OpResult result;
  result.output = std::move(merged.output);
  result.weights = std::move(merged.weights);
  if (pieces.front().return_log_sum_exp) {
    result.log_sum_exp = std::move(merged.log_sum_exp);
  }
  result.implementation = std::move(answers[largest].implementation);
  result.backend = std::move(answers[largest].backend);
  return result;
}

}  // namespace attn
