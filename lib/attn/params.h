// The validated, plain parameter structs that every backend consumes: one per
// operation, carrying pointers, dimensions, scale, valid lengths and flags.
//
// They are built only by attn/validate.h from user-facing requests, so a
// backend may assume: every dimension >= 1, every element count fits
// kMaxTensorElements, every valid length is within [0, columns], and every
// output buffer is allocated with the documented shape. Backends never
// allocate outputs and never see a malformed params struct.
//
// Degenerate rows are decided here, once, for every backend: a row whose valid
// length is 0 (or, with a causal mask combined with valid lengths, whose
// allowed key range is empty) gets all-zero weights and an all-zero output,
// as PyTorch's fused attention does. The textbook's -1e6 fill would instead
// spread the weight uniformly over masked keys; we never let a masked key
// contribute, so "masked positions get exactly zero weight" holds everywhere.
#ifndef ATTN_PARAMS_H_
#define ATTN_PARAMS_H_

#include <algorithm>
#include <cstdint>

namespace attn {

class HeldMemory;

// The arithmetic precision of the products. Inputs and outputs are float32
// either way. kBFloat16 and kFloat16 round every matrix-product operand to
// bfloat16 / IEEE float16 (round to nearest even) and accumulate in float32:
// the semantics of AMX/AVX512-BF16 dot products and of GPU tensor cores.
// Softmax, masks and regression kernels stay float32. A float16 operand
// beyond +-65504 would overflow, so validation rejects such inputs.
enum class Precision { kFloat32, kBFloat16, kFloat16 };

const char* PrecisionName(Precision precision);

// Valid lengths: none, one per batch (B,) or one per query row (B, Q).
struct ValidLengths {
  enum class Kind { kNone, kPerBatch, kPerRow };
  Kind kind = Kind::kNone;
  const int32_t* data = nullptr;
  // Query rows per batch entry of the (B, Q) form; unused otherwise.
  int64_t rows = 0;

  // The number of leading columns row `row` of batch `batch` may attend to;
  // `columns` when there are no valid lengths.
  int64_t Limit(int64_t batch, int64_t row, int64_t columns) const {
    switch (kind) {
      case Kind::kNone:
        return columns;
      case Kind::kPerBatch:
        return data[batch];
      case Kind::kPerRow:
        return data[batch * rows + row];
    }
    return columns;
  }
};

// out = masked_softmax(x) over the last axis of x (batch, rows, columns).
struct MaskedSoftmaxParams {
  const float* x = nullptr;
  float* out = nullptr;
  int64_t batch = 0, rows = 0, columns = 0;
  ValidLengths valid;
};

// out (n, m, p) = a (n, m, k) x b (n, k, p).
struct BatchMatmulParams {
  const float* a = nullptr;
  const float* b = nullptr;
  float* out = nullptr;
  int64_t n = 0, m = 0, k = 0, p = 0;
  Precision precision = Precision::kFloat32;
};

enum class ScoreKind {
  kDotProduct,  // score = scale * q . k
  kGaussian,    // score = scale * -||q - k||^2 / 2
};

// Scaled dot-product (or Gaussian-score) attention.
// q (batch, heads, lq, d), k (batch, heads, lk, d), v (batch, heads, lk, dv),
// out (batch, heads, lq, dv), weights (batch, heads, lq, lk) or null when the
// caller did not ask for them. heads == 1 is the plain (B, L, d) layout. Valid
// lengths index (batch) or (batch, lq) and apply to every head.
struct AttentionParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  float* weights = nullptr;
  int64_t batch = 0, heads = 1, lq = 0, lk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  ScoreKind score = ScoreKind::kDotProduct;
  // Query row i attends to keys j <= i (top-left aligned, as PyTorch's
  // is_causal), intersected with the valid length.
  bool causal = false;
  ValidLengths valid;
  Precision precision = Precision::kFloat32;
  // K and V given as bfloat16 bits instead (AttentionRequest's
  // keys_bfloat16 and values_bfloat16): k and v are then null, and
  // precision is kBFloat16. A backend that cannot read them answers
  // UNIMPLEMENTED; the reference backend reads them.
  const uint16_t* k_bfloat16 = nullptr;
  const uint16_t* v_bfloat16 = nullptr;
  // The keys and values are this held memory's (AttentionRequest::held;
  // batch and heads are then 1): a device backend may read the copy it
  // keeps instead of copying them in.
  const HeldMemory* held = nullptr;
  // Reduced precision: where not null, the engine has left the check that
  // every float32 operand rounds to a finite value of the precision
  // (attn/validate.h's CheckAttentionOperandRange) to the kernel that
  // rounds them, and checks after the call unless that kernel set *this to
  // true. A kernel sets it only when it rounded every element of q, and of
  // k and v unless held as bfloat16, and found each in range; finding one
  // past it (finite, rounding to infinity), it answers OUT_OF_RANGE and the
  // engine names the element. Kernels that do not check leave it alone.
  bool* range_checked = nullptr;
  // Where not null, a kernel that wrote every element of `out` and found
  // each finite may set *this to true, and the engine then skips its own
  // scan of the output for overflowed rows (attn/engine.cc's redo on the
  // reference). A kernel that did not look leaves it alone.
  bool* outputs_finite = nullptr;
  // Where not null, (batch, heads, lq) floats for each query row's
  // log sum_j exp(scale * score_j) over the keys it attends (-inf for
  // none), with the score as AttentionRequest defines it (the Gaussian's
  // -|q|^2 / 2 included). A CPU implementation that does not write it
  // declines the call; a backend that cannot answers UNIMPLEMENTED.
  float* log_sum_exp = nullptr;

  // The number of leading keys query row `row` of (batch, any head) attends.
  int64_t KeyLimit(int64_t b, int64_t row) const {
    int64_t limit = valid.Limit(b, row, lk);
    if (causal) limit = std::min(limit, row + 1);
    return limit;
  }
};

// Additive (MLP) attention: score(q, k) = w_v . tanh(W_q q + W_k k).
// q (batch, lq, dq), k (batch, lk, dk), v (batch, lk, dv), w_q (h, dq),
// w_k (h, dk), w_v (h); out (batch, lq, dv), weights (batch, lq, lk) or null.
struct AdditiveAttentionParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* w_q = nullptr;
  const float* w_k = nullptr;
  const float* w_v = nullptr;
  float* out = nullptr;
  float* weights = nullptr;
  int64_t batch = 0, lq = 0, lk = 0, dq = 0, dk = 0, h = 0, dv = 0;
  ValidLengths valid;
};

// The Nadaraya-Watson kernels of the attention-pooling section, applied to
// the Euclidean distance u = ||x - x_i|| (times the bandwidth, see below).
enum class RegressionKernel {
  kGaussian,      // exp(-u^2 / 2)
  kBoxcar,        // 1 if u < 1 else 0
  kConstant,      // 1
  kEpanechnikov,  // max(0, 1 - u)
};

// Nadaraya-Watson prediction: y(x) = sum_i alpha(x, x_i) y_i with
// alpha = K(w * ||x - x_i||) / sum_j K(w * ||x - x_j||). The nonparametric
// estimate is w = 1; the parametric Gaussian of the chapter,
// softmax(-((x - x_i) w)^2 / 2), is the Gaussian kernel with bandwidth w.
// x_train (n_train, dx), y_train (n_train, dy), x_query (n_query, dx);
// out (n_query, dy), weights (n_query, n_train) or null.
// A query whose kernel mass is zero (a boxcar or Epanechnikov kernel with no
// training point within reach) gets all-zero weights and a zero prediction.
struct NadarayaWatsonParams {
  const float* x_train = nullptr;
  const float* y_train = nullptr;
  const float* x_query = nullptr;
  float* out = nullptr;
  float* weights = nullptr;
  int64_t n_train = 0, n_query = 0, dx = 0, dy = 0;
  RegressionKernel kernel = RegressionKernel::kGaussian;
  float bandwidth = 1.0f;
};

}  // namespace attn

#endif  // ATTN_PARAMS_H_
