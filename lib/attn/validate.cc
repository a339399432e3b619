#include "attn/validate.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attn/bfloat16.h"
#include "attn/status_macros.h"

namespace attn {
namespace {

absl::Status ShapeError(absl::string_view name, absl::string_view expected,
                        const Shape& got) {
  return absl::InvalidArgumentError(absl::StrCat(
      name, ": expected shape ", expected, ", got ", ShapeToString(got)));
}

// Checks that `view` has data and a rank in [min_rank, max_rank] and a valid
// element count; `expected` describes the accepted shapes for the message.
absl::Status CheckTensor(absl::string_view name, const TensorView& view,
                         int min_rank, int max_rank,
                         absl::string_view expected) {
  if (view.rank() < min_rank || view.rank() > max_rank) {
    return ShapeError(name, expected, view.shape);
  }
  RETURN_IF_ERROR(CheckedNumElements(name, view.shape).status());
  if (view.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": shape ", ShapeToString(view.shape),
                     " was given but no data"));
  }
  return absl::OkStatus();
}

// Reduced-precision operands: every input must round to a finite value of
// the product's type, else the rounded operand would be infinite and the
// result NaN: float16 up to +-65504; bfloat16 up to its largest finite value
// (~3.39e38: float's top few values round past it).
absl::Status CheckOperandRange(absl::string_view name, const TensorView& view,
                               Precision precision) {
  if (precision == Precision::kFloat32) return absl::OkStatus();
  const bool half = precision == Precision::kFloat16;
  const int64_t count = view.num_elements();
  // A branch-free scan first (this runs on every reduced-precision call, on
  // one thread): the bits of |x| order finite floats as their values and
  // put infinities and NaN above them all, so limit - bits(|x|) is negative
  // exactly past the limit; its sign bits are OR-ed together (an OR of
  // differences vectorizes on baseline x86-64's SSE2, where the integer max
  // this was before does not: it cost a quarter of a large bfloat16 call on
  // AMX). Only past the type's limit is the offending element looked for.
  // bfloat16 rounds to infinity from 0x7f7f8000 (halfway from its largest
  // finite value to infinity, a tie that goes to the even infinity) on.
  const int32_t limit = half ? 0x477fe000 /* 65504 */ : 0x7f7f7fff;
  uint32_t past_limit = 0;
  for (int64_t i = 0; i < count; ++i) {
    int32_t bits;
    std::memcpy(&bits, &view.data[i], sizeof(bits));
    // Both in [0, 2^31): the difference cannot overflow.
    past_limit |= static_cast<uint32_t>(limit - (bits & 0x7fffffff));
  }
  if ((past_limit >> 31) == 0) return absl::OkStatus();
  for (int64_t i = 0; i < count; ++i) {
    const float x = view.data[i];
    if (!std::isfinite(x)) continue;  // reported by the finiteness check
    const bool overflows = half ? std::fabs(x) > 65504.0f
                                : std::isinf(RoundToBFloat16(x));
    if (overflows) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": element ", i, " is ", x, ", beyond ",
          half ? "float16's range +-65504 (precision fp16); scale the input "
                 "or use fp32 or bf16"
               : "bfloat16's range +-3.39e38 (precision bf16); scale the "
                 "input or use fp32"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDim(absl::string_view name, const TensorView& view, int axis,
                      int64_t want, absl::string_view expected) {
  if (view.shape[axis] != want) return ShapeError(name, expected, view.shape);
  return absl::OkStatus();
}

// Validates valid_lens against batch `batch`, `rows` query rows per batch
// entry and `columns` keys; fills `out`.
absl::Status CheckLengths(const LengthsView& lens, int64_t batch, int64_t rows,
                          int64_t columns, ValidLengths* out) {
  *out = ValidLengths{};
  if (!lens.present()) return absl::OkStatus();
  const std::string expected =
      absl::StrCat("(", batch, ",) or (", batch, ", ", rows, ")");
  int64_t count = 0;
  if (lens.shape.size() == 1 && lens.shape[0] == batch) {
    out->kind = ValidLengths::Kind::kPerBatch;
    count = batch;
  } else if (lens.shape.size() == 2 && lens.shape[0] == batch &&
             lens.shape[1] == rows) {
    out->kind = ValidLengths::Kind::kPerRow;
    out->rows = rows;
    count = batch * rows;
  } else {
    return ShapeError("valid_lens", expected, lens.shape);
  }
  if (lens.data == nullptr) {
    return absl::InvalidArgumentError("valid_lens: shape given but no data");
  }
  for (int64_t i = 0; i < count; ++i) {
    if (lens.data[i] < 0 || lens.data[i] > columns) {
      return absl::InvalidArgumentError(absl::StrCat(
          "valid_lens: element ", i, " is ", lens.data[i],
          "; valid lengths must lie in [0, ", columns,
          "] (the number of keys)"));
    }
  }
  out->data = lens.data;
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(absl::string_view name, double value) {
  if (!std::isfinite(value) || value <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": must be finite and positive, got ", value));
  }
  return absl::OkStatus();
}

// The (rows, columns) of a 1-D (n,) or 2-D (n, d) regression input.
struct Matrix {
  int64_t rows = 0;
  int64_t columns = 0;
};

absl::StatusOr<Matrix> CheckRegressionInput(absl::string_view name,
                                            const TensorView& view,
                                            absl::string_view expected) {
  RETURN_IF_ERROR(CheckTensor(name, view, 1, 2, expected));
  return Matrix{view.shape[0], view.rank() == 2 ? view.shape[1] : 1};
}

absl::StatusOr<Plan<NadarayaWatsonParams>> CheckTrainingPairs(
    const TensorView& x_train, const TensorView& y_train) {
  ASSIGN_OR_RETURN(Matrix x, CheckRegressionInput("x_train", x_train,
                                                  "(n,) or (n, dx)"));
  ASSIGN_OR_RETURN(
      Matrix y,
      CheckRegressionInput(
          "y_train", y_train,
          absl::StrCat("(", x.rows, ",) or (", x.rows, ", dy)")));
  if (y.rows != x.rows) {
    return ShapeError("y_train",
                      absl::StrCat("(", x.rows, ",) or (", x.rows,
                                   ", dy) [one target per training input]"),
                      y_train.shape);
  }
  Plan<NadarayaWatsonParams> plan;
  NadarayaWatsonParams& p = plan.params;
  p.x_train = x_train.data;
  p.y_train = y_train.data;
  p.n_train = x.rows;
  p.dx = x.columns;
  p.dy = y.columns;
  return plan;
}

}  // namespace

absl::StatusOr<Plan<MaskedSoftmaxParams>> ValidateMaskedSoftmax(
    const MaskedSoftmaxRequest& request) {
  RETURN_IF_ERROR(CheckTensor("x", request.x, 3, 3, "(B, Q, K)"));
  Plan<MaskedSoftmaxParams> plan;
  MaskedSoftmaxParams& p = plan.params;
  p.x = request.x.data;
  p.batch = request.x.shape[0];
  p.rows = request.x.shape[1];
  p.columns = request.x.shape[2];
  RETURN_IF_ERROR(
      CheckLengths(request.valid_lens, p.batch, p.rows, p.columns, &p.valid));
  plan.output_shape = request.x.shape;
  return plan;
}

absl::StatusOr<Plan<BatchMatmulParams>> ValidateBatchMatmul(
    const BatchMatmulRequest& request) {
  RETURN_IF_ERROR(CheckTensor("a", request.a, 3, 3, "(n, m, k)"));
  const int64_t n = request.a.shape[0];
  const int64_t k = request.a.shape[2];
  const std::string expected_b = absl::StrCat("(", n, ", ", k, ", p)");
  RETURN_IF_ERROR(CheckTensor("b", request.b, 3, 3, expected_b));
  RETURN_IF_ERROR(CheckDim("b", request.b, 0, n, expected_b));
  RETURN_IF_ERROR(CheckDim("b", request.b, 1, k, expected_b));
  Plan<BatchMatmulParams> plan;
  BatchMatmulParams& p = plan.params;
  p.a = request.a.data;
  p.b = request.b.data;
  p.n = n;
  p.m = request.a.shape[1];
  p.k = k;
  p.p = request.b.shape[2];
  p.precision = request.precision;
  RETURN_IF_ERROR(CheckOperandRange("a", request.a, p.precision));
  RETURN_IF_ERROR(CheckOperandRange("b", request.b, p.precision));
  plan.output_shape = {p.n, p.m, p.p};
  RETURN_IF_ERROR(CheckedNumElements("output", plan.output_shape).status());
  return plan;
}

// ValidateAttention, with the operands' range check (which reads every
// element) or without it.
static absl::StatusOr<Plan<AttentionParams>> ValidateAttentionFor(
    const AttentionRequest& request, bool check_range) {
  RETURN_IF_ERROR(CheckTensor("queries", request.queries, 3, 4,
                              "(B, Lq, d) or (B, H, Lq, d)"));
  const TensorView& q = request.queries;
  const bool multi_head = q.rank() == 4;
  const int64_t batch = q.shape[0];
  const int64_t heads = multi_head ? q.shape[1] : 1;
  const int64_t lq = q.shape[q.rank() - 2];
  const int64_t d = q.shape[q.rank() - 1];
  const std::string prefix =
      multi_head ? absl::StrCat("(", batch, ", ", heads, ", ")
                 : absl::StrCat("(", batch, ", ");
  const int rank = static_cast<int>(q.rank());

  // Keys and values held as bfloat16 are checked through views of their
  // bits: the shapes are what matters here.
  const bool held_bfloat16 = request.keys_bfloat16 != nullptr ||
                             request.values_bfloat16 != nullptr;
  TensorView k = request.keys;
  TensorView v = request.values;
  if (held_bfloat16) {
    if (request.keys_bfloat16 == nullptr || request.values_bfloat16 == nullptr ||
        k.data != nullptr || v.data != nullptr) {
      return absl::InvalidArgumentError(
          "keys, values: give both as float32 data or both as bfloat16 "
          "bits, not a mix");
    }
    if (request.precision != Precision::kBFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "precision: keys and values held as bfloat16 compute in bfloat16, "
          "not ", PrecisionName(request.precision)));
    }
    k.data = reinterpret_cast<const float*>(request.keys_bfloat16);
    v.data = reinterpret_cast<const float*>(request.values_bfloat16);
  }
  const std::string expected_k = absl::StrCat(prefix, "Lk, ", d, ")");
  RETURN_IF_ERROR(CheckTensor("keys", k, rank, rank, expected_k));
  for (int axis = 0; axis < rank - 2; ++axis) {
    RETURN_IF_ERROR(CheckDim("keys", k, axis, q.shape[axis], expected_k));
  }
  RETURN_IF_ERROR(CheckDim("keys", k, rank - 1, d, expected_k));
  const int64_t lk = k.shape[rank - 2];

  const std::string expected_v = absl::StrCat(prefix, lk, ", v)");
  RETURN_IF_ERROR(CheckTensor("values", v, rank, rank, expected_v));
  for (int axis = 0; axis < rank - 1; ++axis) {
    RETURN_IF_ERROR(CheckDim("values", v, axis, k.shape[axis], expected_v));
  }
  const int64_t dv = v.shape[rank - 1];

  Plan<AttentionParams> plan;
  AttentionParams& p = plan.params;
  p.q = q.data;
  if (held_bfloat16) {
    p.k_bfloat16 = request.keys_bfloat16;
    p.v_bfloat16 = request.values_bfloat16;
  } else {
    p.k = k.data;
    p.v = v.data;
  }
  if (request.held != nullptr && batch * heads != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keys, values: a held memory is one batch entry of one head, not ",
        batch, " x ", heads));
  }
  p.held = request.held;
  p.batch = batch;
  p.heads = heads;
  p.lq = lq;
  p.lk = lk;
  p.d = d;
  p.dv = dv;
  p.score = request.score;
  p.causal = request.causal;
  p.precision = request.precision;
  if (check_range) RETURN_IF_ERROR(CheckAttentionOperandRange(request));
  if (request.scale.has_value()) {
    RETURN_IF_ERROR(CheckPositiveFinite("scale", *request.scale));
    p.scale = *request.scale;
  } else {
    p.scale = request.score == ScoreKind::kDotProduct
                  ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))
                  : 1.0f;
  }
  RETURN_IF_ERROR(CheckLengths(request.valid_lens, batch, lq, lk, &p.valid));

  plan.output_shape = q.shape;
  plan.output_shape.back() = dv;
  RETURN_IF_ERROR(CheckedNumElements("output", plan.output_shape).status());
  if (request.return_weights) {
    plan.weights_shape = q.shape;
    plan.weights_shape.back() = lk;
    RETURN_IF_ERROR(
        CheckedNumElements("weights", plan.weights_shape).status());
  }
  return plan;
}

absl::StatusOr<Plan<AdditiveAttentionParams>> ValidateAdditiveAttention(
    const AdditiveAttentionRequest& request) {
  RETURN_IF_ERROR(
      CheckTensor("queries", request.queries, 3, 3, "(B, Lq, q)"));
  const int64_t batch = request.queries.shape[0];
  const int64_t lq = request.queries.shape[1];
  const int64_t dq = request.queries.shape[2];

  const std::string expected_k = absl::StrCat("(", batch, ", Lk, k)");
  RETURN_IF_ERROR(CheckTensor("keys", request.keys, 3, 3, expected_k));
  RETURN_IF_ERROR(CheckDim("keys", request.keys, 0, batch, expected_k));
  const int64_t lk = request.keys.shape[1];
  const int64_t dk = request.keys.shape[2];

  const std::string expected_v = absl::StrCat("(", batch, ", ", lk, ", v)");
  RETURN_IF_ERROR(CheckTensor("values", request.values, 3, 3, expected_v));
  RETURN_IF_ERROR(CheckDim("values", request.values, 0, batch, expected_v));
  RETURN_IF_ERROR(CheckDim("values", request.values, 1, lk, expected_v));

  const std::string expected_wq = absl::StrCat("(h, ", dq, ")");
  RETURN_IF_ERROR(CheckTensor("w_q", request.w_q, 2, 2, expected_wq));
  RETURN_IF_ERROR(CheckDim("w_q", request.w_q, 1, dq, expected_wq));
  const int64_t h = request.w_q.shape[0];
  const std::string expected_wk = absl::StrCat("(", h, ", ", dk, ")");
  RETURN_IF_ERROR(CheckTensor("w_k", request.w_k, 2, 2, expected_wk));
  RETURN_IF_ERROR(CheckDim("w_k", request.w_k, 0, h, expected_wk));
  RETURN_IF_ERROR(CheckDim("w_k", request.w_k, 1, dk, expected_wk));
  const std::string expected_wv = absl::StrCat("(", h, ",)");
  RETURN_IF_ERROR(CheckTensor("w_v", request.w_v, 1, 1, expected_wv));
  RETURN_IF_ERROR(CheckDim("w_v", request.w_v, 0, h, expected_wv));

  Plan<AdditiveAttentionParams> plan;
  AdditiveAttentionParams& p = plan.params;
  p.q = request.queries.data;
  p.k = request.keys.data;
  p.v = request.values.data;
  p.w_q = request.w_q.data;
  p.w_k = request.w_k.data;
  p.w_v = request.w_v.data;
  p.batch = batch;
  p.lq = lq;
  p.lk = lk;
  p.dq = dq;
  p.dk = dk;
  p.h = h;
  p.dv = request.values.shape[2];
  RETURN_IF_ERROR(CheckLengths(request.valid_lens, batch, lq, lk, &p.valid));
  plan.output_shape = {batch, lq, p.dv};
  RETURN_IF_ERROR(CheckedNumElements("output", plan.output_shape).status());
  if (request.return_weights) {
    plan.weights_shape = {batch, lq, lk};
    RETURN_IF_ERROR(
        CheckedNumElements("weights", plan.weights_shape).status());
  }
  return plan;
}

absl::StatusOr<Plan<NadarayaWatsonParams>> ValidateNadarayaWatson(
    const NadarayaWatsonRequest& request) {
  ASSIGN_OR_RETURN(Plan<NadarayaWatsonParams> plan,
                   CheckTrainingPairs(request.x_train, request.y_train));
  NadarayaWatsonParams& p = plan.params;
  const std::string expected_query =
      p.dx == 1 && request.x_train.rank() == 1
          ? std::string("(m,)")
          : absl::StrCat("(m, ", p.dx, ")");
  RETURN_IF_ERROR(CheckTensor("x_query", request.x_query,
                              static_cast<int>(request.x_train.rank()),
                              static_cast<int>(request.x_train.rank()),
                              expected_query));
  if (request.x_query.rank() == 2) {
    RETURN_IF_ERROR(
        CheckDim("x_query", request.x_query, 1, p.dx, expected_query));
  }
  RETURN_IF_ERROR(CheckPositiveFinite("bandwidth", request.bandwidth));
  p.x_query = request.x_query.data;
  p.n_query = request.x_query.shape[0];
  p.kernel = request.kernel;
  p.bandwidth = request.bandwidth;
  if (request.y_train.rank() == 1) {
    plan.output_shape = {p.n_query};
  } else {
    plan.output_shape = {p.n_query, p.dy};
  }
  RETURN_IF_ERROR(CheckedNumElements("output", plan.output_shape).status());
  if (request.return_weights) {
    plan.weights_shape = {p.n_query, p.n_train};
    RETURN_IF_ERROR(
        CheckedNumElements("weights", plan.weights_shape).status());
  }
  return plan;
}

absl::StatusOr<Plan<NadarayaWatsonParams>> ValidateFitBandwidth(
    const FitBandwidthRequest& request) {
  ASSIGN_OR_RETURN(Plan<NadarayaWatsonParams> plan,
                   CheckTrainingPairs(request.x_train, request.y_train));
  if (plan.params.n_train < 2) {
    return ShapeError("x_train",
                      "(n,) or (n, dx) with n >= 2 (each point is predicted "
                      "from the others)",
                      request.x_train.shape);
  }
  RETURN_IF_ERROR(
      CheckPositiveFinite("initial_bandwidth", request.initial_bandwidth));
  RETURN_IF_ERROR(CheckPositiveFinite("learning_rate", request.learning_rate));
  if (request.epochs < 1 || request.epochs > 100000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epochs: must lie in [1, 100000], got ", request.epochs));
  }
  plan.params.bandwidth = request.initial_bandwidth;
  return plan;
}

namespace {

template <typename Params>
absl::StatusOr<ResultSize> SizeOfPlan(
    const absl::StatusOr<Plan<Params>>& plan) {
  if (!plan.ok()) return plan.status();
  ResultSize size;
  size.output_shape = plan->output_shape;
  size.weights_shape = plan->weights_shape;
  // Validation checked both counts (at most 2^31 - 1 each): the sum cannot
  // overflow.
  size.elements = *CheckedNumElements("output", size.output_shape);
  if (!size.weights_shape.empty()) {
    size.elements += *CheckedNumElements("weights", size.weights_shape);
  }
  return size;
}

}  // namespace

absl::StatusOr<ResultSize> SizeOfResult(const MaskedSoftmaxRequest& request) {
  return SizeOfPlan(ValidateMaskedSoftmax(request));
}
absl::StatusOr<Plan<BatchMatmulParams>> ValidateBatchMatmulShapes(
    const BatchMatmulRequest& request) {
  BatchMatmulRequest shapes = request;
  shapes.precision = Precision::kFloat32;
  ASSIGN_OR_RETURN(Plan<BatchMatmulParams> plan, ValidateBatchMatmul(shapes));
  plan.params.precision = request.precision;
  return plan;
}
absl::StatusOr<Plan<AttentionParams>> ValidateAttention(
    const AttentionRequest& request) {
  return ValidateAttentionFor(request, /*check_range=*/true);
}

absl::StatusOr<Plan<AttentionParams>> ValidateAttentionShapes(
    const AttentionRequest& request) {
  return ValidateAttentionFor(request, /*check_range=*/false);
}

absl::Status CheckAttentionOperandRange(const AttentionRequest& request) {
  RETURN_IF_ERROR(
      CheckOperandRange("queries", request.queries, request.precision));
  // Keys and values held as bfloat16 are in range by construction.
  if (request.keys_bfloat16 == nullptr) {
    RETURN_IF_ERROR(CheckOperandRange("keys", request.keys, request.precision));
    RETURN_IF_ERROR(
        CheckOperandRange("values", request.values, request.precision));
  }
  return absl::OkStatus();
}

absl::StatusOr<ResultSize> SizeOfResult(const BatchMatmulRequest& request) {
  return SizeOfPlan(ValidateBatchMatmulShapes(request));
}
absl::StatusOr<ResultSize> SizeOfResult(const AttentionRequest& request) {
  return SizeOfPlan(ValidateAttentionShapes(request));
}
absl::StatusOr<ResultSize> SizeOfResult(
    const AdditiveAttentionRequest& request) {
  return SizeOfPlan(ValidateAdditiveAttention(request));
}
absl::StatusOr<ResultSize> SizeOfResult(const NadarayaWatsonRequest& request) {
  return SizeOfPlan(ValidateNadarayaWatson(request));
}

}  // namespace attn
