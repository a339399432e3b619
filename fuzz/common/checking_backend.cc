#include "fuzz/common/checking_backend.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "attn/tensor.h"

namespace attn_fuzz {
namespace {

// Reads every element: AddressSanitizer checks each load.
void Touch(const char* what, const float* data, int64_t count) {
  FUZZ_CHECK(data != nullptr, "%s: null input with %lld elements", what,
             static_cast<long long>(count));
  volatile float sink = 0.0f;
  for (int64_t i = 0; i < count; ++i) sink = sink + data[i] * 0.0f;
}

void Zero(const char* what, float* data, int64_t count) {
  FUZZ_CHECK(data != nullptr, "%s: null output with %lld elements", what,
             static_cast<long long>(count));
  for (int64_t i = 0; i < count; ++i) data[i] = 0.0f;
}

// The product of positive dimensions, checked against the library's
// per-tensor limit (validation promises both).
int64_t Elements(const char* what, std::initializer_list<int64_t> dims) {
  int64_t count = 1;
  for (int64_t dim : dims) {
    FUZZ_CHECK(dim >= 1, "%s: dimension %lld < 1 passed validation", what,
               static_cast<long long>(dim));
    FUZZ_CHECK(dim <= attn::kMaxTensorElements / count,
               "%s: more than 2^31-1 elements passed validation", what);
    count *= dim;
  }
  return count;
}

// Every valid length within [0, columns], of the form the kind says.
void CheckLengths(const attn::ValidLengths& valid, int64_t batch, int64_t rows,
                  int64_t columns) {
  int64_t count = 0;
  switch (valid.kind) {
    case attn::ValidLengths::Kind::kNone:
      return;
    case attn::ValidLengths::Kind::kPerBatch:
      count = batch;
      break;
    case attn::ValidLengths::Kind::kPerRow:
      FUZZ_CHECK(valid.rows == rows, "per-row lengths for %lld rows, not %lld",
                 static_cast<long long>(valid.rows),
                 static_cast<long long>(rows));
      count = batch * rows;
      break;
  }
  FUZZ_CHECK(valid.data != nullptr, "valid lengths without data");
  for (int64_t i = 0; i < count; ++i) {
    FUZZ_CHECK(valid.data[i] >= 0 && valid.data[i] <= columns,
               "valid length %lld at %lld is outside [0, %lld]",
               static_cast<long long>(valid.data[i]),
               static_cast<long long>(i), static_cast<long long>(columns));
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < rows; r += rows > 1 ? rows - 1 : 1) {
      const int64_t limit = valid.Limit(b, r, columns);
      FUZZ_CHECK(limit >= 0 && limit <= columns, "Limit() outside [0, %lld]",
                 static_cast<long long>(columns));
    }
  }
}

absl::Status Decline() {
  return absl::UnimplementedError("small: the reference runs it");
}

}  // namespace

void CheckingBackend::CheckOutputSize(const char* op, int64_t elements) const {
  FUZZ_CHECK(4 * elements <= max_output_bytes_,
             "%s: a result of %lld float32 values (%lld bytes) is being "
             "computed, over the response limit of %lld bytes it will be "
             "refused for",
             op, static_cast<long long>(elements),
             static_cast<long long>(4 * elements),
             static_cast<long long>(max_output_bytes_));
}

absl::StatusOr<const char*> CheckingBackend::MaskedSoftmax(const attn::MaskedSoftmaxParams& p) {
  const int64_t n = Elements("masked_softmax x", {p.batch, p.rows, p.columns});
  CheckLengths(p.valid, p.batch, p.rows, p.columns);
  CheckOutputSize("masked_softmax", n);
  if (5.0 * n < reference_below_flops_) return Decline();
  Touch("x", p.x, n);
  Zero("out", p.out, n);
  return kName;
}

absl::StatusOr<const char*> CheckingBackend::BatchMatmul(const attn::BatchMatmulParams& p) {
  const int64_t a = Elements("batch_matmul a", {p.n, p.m, p.k});
  const int64_t b = Elements("batch_matmul b", {p.n, p.k, p.p});
  const int64_t out = Elements("batch_matmul out", {p.n, p.m, p.p});
  CheckOutputSize("batch_matmul", out);
  if (2.0 * p.n * p.m * p.k * p.p < reference_below_flops_) return Decline();
  Touch("a", p.a, a);
  Touch("b", p.b, b);
  Zero("out", p.out, out);
  return kName;
}

absl::StatusOr<const char*> CheckingBackend::ScaledDotProductAttention(
    const attn::AttentionParams& p) {
  const int64_t q = Elements("attention q", {p.batch, p.heads, p.lq, p.d});
  const int64_t k = Elements("attention k", {p.batch, p.heads, p.lk, p.d});
  const int64_t v = Elements("attention v", {p.batch, p.heads, p.lk, p.dv});
  const int64_t out = Elements("attention out", {p.batch, p.heads, p.lq, p.dv});
  const int64_t weights =
      p.weights == nullptr
          ? 0
          : Elements("attention weights", {p.batch, p.heads, p.lq, p.lk});
  CheckOutputSize("attention", out + weights);
  CheckLengths(p.valid, p.batch, p.lq, p.lk);
  FUZZ_CHECK(std::isfinite(p.scale) && p.scale > 0, "scale %g passed validation",
             static_cast<double>(p.scale));
  if (2.0 * p.batch * p.heads * p.lq * p.lk * (p.d + p.dv) <
      reference_below_flops_) {
    return Decline();
  }
  Touch("q", p.q, q);
  Touch("k", p.k, k);
  Touch("v", p.v, v);
  Zero("out", p.out, out);
  if (p.weights != nullptr) Zero("weights", p.weights, weights);
  return kName;
}

absl::StatusOr<const char*> CheckingBackend::AdditiveAttention(
    const attn::AdditiveAttentionParams& p) {
  const int64_t q = Elements("additive q", {p.batch, p.lq, p.dq});
  const int64_t k = Elements("additive k", {p.batch, p.lk, p.dk});
  const int64_t v = Elements("additive v", {p.batch, p.lk, p.dv});
  const int64_t wq = Elements("additive w_q", {p.h, p.dq});
  const int64_t wk = Elements("additive w_k", {p.h, p.dk});
  const int64_t wv = Elements("additive w_v", {p.h});
  const int64_t out = Elements("additive out", {p.batch, p.lq, p.dv});
  const int64_t weights =
      p.weights == nullptr
          ? 0
          : Elements("additive weights", {p.batch, p.lq, p.lk});
  CheckOutputSize("additive_attention", out + weights);
  CheckLengths(p.valid, p.batch, p.lq, p.lk);
  if (2.0 * p.batch * p.lq * p.lk * (p.h + p.dv) +
          2.0 * p.h * (static_cast<double>(q) + k) <
      reference_below_flops_) {
    return Decline();
  }
  Touch("q", p.q, q);
  Touch("k", p.k, k);
  Touch("v", p.v, v);
  Touch("w_q", p.w_q, wq);
  Touch("w_k", p.w_k, wk);
  Touch("w_v", p.w_v, wv);
  Zero("out", p.out, out);
  if (p.weights != nullptr) Zero("weights", p.weights, weights);
  return kName;
}

absl::StatusOr<const char*> CheckingBackend::NadarayaWatson(
    const attn::NadarayaWatsonParams& p) {
  const int64_t x_train = Elements("nw x_train", {p.n_train, p.dx});
  const int64_t y_train = Elements("nw y_train", {p.n_train, p.dy});
  const int64_t x_query = Elements("nw x_query", {p.n_query, p.dx});
  const int64_t out = Elements("nw out", {p.n_query, p.dy});
  const int64_t weights =
      p.weights == nullptr ? 0 : Elements("nw weights", {p.n_query, p.n_train});
  CheckOutputSize("nadaraya_watson", out + weights);
  FUZZ_CHECK(std::isfinite(p.bandwidth) && p.bandwidth > 0,
             "bandwidth %g passed validation",
             static_cast<double>(p.bandwidth));
  if (2.0 * p.n_query * p.n_train * (p.dx + p.dy) < reference_below_flops_) {
    return Decline();
  }
  Touch("x_train", p.x_train, x_train);
  Touch("y_train", p.y_train, y_train);
  Touch("x_query", p.x_query, x_query);
  Zero("out", p.out, out);
  if (p.weights != nullptr) Zero("weights", p.weights, weights);
  return kName;
}

}  // namespace attn_fuzz
