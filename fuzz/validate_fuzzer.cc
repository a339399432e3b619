// Fuzz target: the library's validation of shapes and valid lengths
// (attn/validate.h: ValidateMaskedSoftmax, ValidateBatchMatmul,
// ValidateAttention, ValidateAdditiveAttention, ValidateNadarayaWatson,
// ValidateFitBandwidth), which every backend relies on for memory safety.
//
// Feeds: a structured request drawn from the bytes with FuzzedDataProvider:
// the operation; eight shape symbols (B, H, Lq, Lk, d, v, h, dk), each small
// or one of the edge values (0, negative, 2^16..2^62, 2^31-1 and its
// neighbours, any int64); every tensor's shape from its documented layout
// over those symbols, or distorted (a dimension swapped for another symbol
// or a fresh value, an axis dropped or added); valid lengths of shape (B,),
// (B, Lq) or another, with values in range or at the edges (-1, Lk, Lk+1,
// INT32_MIN/MAX); null data; float16 operands beyond +-65504; the flags and
// scalars (scale, bandwidth, learning rate, epochs) at their edges (0,
// negative, NaN, infinities, denormals).
//
// Asserts, beyond "no crash, no leak, no undefined behaviour":
// - validation accepts exactly the requests an independent oracle written
//   here from the documented contract (attn/ops.h, attn/validate.h) accepts,
//   and refuses the others with INVALID_ARGUMENT; in particular it never
//   accepts an out-of-range valid length, a non-positive dimension or a
//   tensor (input, output or weights) of more than 2^31-1 elements;
// - an accepted plan carries the dimensions, data pointers, valid-length
//   form, scale and output and weights shapes the contract says;
// - where every tensor fits in memory and the work is small, the reference
//   kernels run on the plan over buffers of exactly the validated sizes
//   (AddressSanitizer catches any read or write past them), masked weights
//   come out exactly zero and every weights row sums to 1 or is all zero;
//   the bandwidth fit runs and returns one loss per epoch, finite numbers
//   and a positive bandwidth, or INVALID_ARGUMENT.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/fit.h"
#include "attn/ops.h"
#include "attn/reference.h"
#include "attn/validate.h"
#include "fuzz/common/check.h"
#include "fuzz/common/shapes.h"

namespace {

using attn::Shape;
using attn_fuzz::ElementCount;

// Tensors up to this many elements are backed by real buffers.
constexpr int64_t kMaxBacked = int64_t{1} << 16;
// The reference kernels run below this much nominal work.
constexpr double kMaxWork = 2e5;
constexpr float kFloat16Max = 65504.0f;

enum Symbol { kB, kH, kLq, kLk, kD, kV, kHidden, kDk, kSymbols };

std::string Str(const Shape& shape) { return attn_fuzz::DimsToString(shape); }

int64_t EdgeOrSmall(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return 0;
    case 1:
      return -p.ConsumeIntegralInRange<int64_t>(1, 3);
    case 2:
      return p.ConsumeIntegral<int64_t>();
    case 3:
      return int64_t{1} << p.ConsumeIntegralInRange<int>(16, 62);
    case 4:
      return attn::kMaxTensorElements + p.ConsumeIntegralInRange<int>(-1, 1);
    case 5:
      return std::numeric_limits<int64_t>::max();
    case 6:
      return p.ConsumeIntegralInRange<int64_t>(1, 100);
    default:
      return p.ConsumeIntegralInRange<int64_t>(1, 5);
  }
}

// A tensor's shape: its layout over the symbols, or distorted.
Shape MakeShape(FuzzedDataProvider& p, const int64_t* symbols,
                std::initializer_list<Symbol> layout) {
  Shape shape;
  for (Symbol s : layout) shape.push_back(symbols[s]);
  if (p.ConsumeIntegralInRange<int>(0, 7) != 0) return shape;
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      if (!shape.empty()) {
        shape[p.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] =
            symbols[p.ConsumeIntegralInRange<int>(0, kSymbols - 1)];
      }
      break;
    case 1:
      if (!shape.empty()) {
        shape[p.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] =
            EdgeOrSmall(p);
      }
      break;
    case 2:
      if (!shape.empty()) shape.pop_back();
      break;
    default:
      shape.push_back(symbols[p.ConsumeIntegralInRange<int>(0, kSymbols - 1)]);
      break;
  }
  return shape;
}

float EdgeFloat(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      return 0.0f;
    case 1:
      return -1.0f;
    case 2:
      return std::numeric_limits<float>::quiet_NaN();
    case 3:
      return std::numeric_limits<float>::infinity();
    case 4:
      return -std::numeric_limits<float>::infinity();
    case 5:
      return std::numeric_limits<float>::denorm_min();
    case 6:
      return std::numeric_limits<float>::max();
    case 7:
      return p.ConsumeFloatingPoint<float>();
    default:
      return p.ConsumeFloatingPointInRange<float>(0.01f, 10.0f);
  }
}

// The tensors of one request: their buffers, exactly as large as their shapes
// say when they fit (kMaxBacked); else unbacked (a dummy pointer that no
// check may read: the oracle then forbids float16, whose range check reads
// every element, and no kernel runs).
struct Buffers {
  std::vector<std::unique_ptr<std::vector<float>>> floats;
  std::vector<std::unique_ptr<std::vector<int32_t>>> ints;
  bool all_backed = true;
  bool over_float16 = false;  // some operand beyond +-65504
  float dummy = 0.0f;

  attn::TensorView Tensor(FuzzedDataProvider& p, Shape shape) {
    attn::TensorView view;
    view.shape = std::move(shape);
    if (p.ConsumeIntegralInRange<int>(0, 31) == 0) return view;  // null data
    // A scalar is refused by every operation (wrong rank) before any read.
    if (view.shape.empty()) {
      view.data = &dummy;
      return view;
    }
    const auto count = ElementCount(view.shape);
    if (!count.has_value() || *count > kMaxBacked) {
      all_backed = false;
      view.data = &dummy;
      return view;
    }
    auto& buffer = floats.emplace_back(std::make_unique<std::vector<float>>(*count));
    for (int64_t i = 0; i < *count; ++i) {
      (*buffer)[i] = static_cast<float>((i * 37) % 17 - 8) * 0.25f;
    }
    if (p.ConsumeIntegralInRange<int>(0, 15) == 0) {
      // Beyond float16's range; beyond bfloat16's (rounds to infinity).
      constexpr float kOutOfRange[] = {70000.0f, -1e30f, 3.4e38f};
      (*buffer)[p.ConsumeIntegralInRange<int64_t>(0, *count - 1)] =
          kOutOfRange[p.ConsumeIntegralInRange<int>(0, 2)];
      over_float16 = true;
    }
    view.data = buffer->data();
    return view;
  }

  attn::LengthsView Lengths(FuzzedDataProvider& p, const int64_t* symbols) {
    attn::LengthsView view;
    switch (p.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
        return view;  // absent
      case 1:
      case 2:
        view.shape = {symbols[kB]};
        break;
      case 3:
      case 4:
        view.shape = {symbols[kB], symbols[kLq]};
        break;
      default:
        view.shape = MakeShape(p, symbols, {kB, kLq, kLk});
        break;
    }
    const auto count = ElementCount(view.shape);
    if (!count.has_value() || *count > kMaxBacked ||
        p.ConsumeIntegralInRange<int>(0, 31) == 0) {
      return view;  // no data
    }
    auto& buffer = ints.emplace_back(std::make_unique<std::vector<int32_t>>(*count));
    const int64_t lk = symbols[kLk];
    for (int32_t& value : *buffer) {
      switch (p.ConsumeIntegralInRange<int>(0, 15)) {
        case 0:
          value = -1;
          break;
        case 1:
          value = lk < INT32_MAX ? static_cast<int32_t>(lk + 1) : INT32_MAX;
          break;
        case 2:
          value = p.ConsumeBool() ? INT32_MIN : INT32_MAX;
          break;
        case 3:
          value = p.ConsumeIntegral<int32_t>();
          break;
        default:
          value = lk >= 0 ? static_cast<int32_t>(p.ConsumeIntegralInRange<int64_t>(
                                0, std::min<int64_t>(lk, INT32_MAX)))
                          : 0;
          break;
      }
    }
    view.data = buffer->data();
    return view;
  }
};

// The oracle's verdict on one tensor: usable with a rank in [lo, hi].
bool Good(const attn::TensorView& t, size_t lo, size_t hi) {
  return t.shape.size() >= lo && t.shape.size() <= hi &&
         ElementCount(t.shape).has_value() && t.data != nullptr;
}

bool GoodLengths(const attn::LengthsView& lens, int64_t batch, int64_t rows,
                 int64_t columns) {
  if (!lens.present()) return true;
  int64_t count = 0;
  if (lens.shape == Shape{batch}) {
    count = batch;
  } else if (lens.shape == Shape{batch, rows}) {
    count = batch * rows;
  } else {
    return false;
  }
  if (lens.data == nullptr) return false;
  for (int64_t i = 0; i < count; ++i) {
    if (lens.data[i] < 0 || lens.data[i] > columns) return false;
  }
  return true;
}

// Every operand of a reduced-precision product must round to a finite
// value: float16 within +-65504, bfloat16 short of float's top values.
bool InFloat16Range(const attn::TensorView& t, attn::Precision precision) {
  if (precision == attn::Precision::kFloat32) return true;
  const int64_t count = *ElementCount(t.shape);
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(t.data[i])) continue;
    if (precision == attn::Precision::kFloat16
            ? std::fabs(t.data[i]) > kFloat16Max
            : std::isinf(attn::RoundToBFloat16(t.data[i]))) {
      return false;
    }
  }
  return true;
}

bool PositiveFinite(double value) { return std::isfinite(value) && value > 0; }

// The form the plan's valid lengths must take.
void CheckPlanLengths(const attn::ValidLengths& valid,
                      const attn::LengthsView& lens, int64_t rows) {
  if (!lens.present()) {
    FUZZ_CHECK(valid.kind == attn::ValidLengths::Kind::kNone, "lengths kind");
    return;
  }
  FUZZ_CHECK(valid.data == lens.data, "lengths data pointer");
  if (lens.shape.size() == 1) {
    FUZZ_CHECK(valid.kind == attn::ValidLengths::Kind::kPerBatch, "kind");
  } else {
    FUZZ_CHECK(valid.kind == attn::ValidLengths::Kind::kPerRow &&
                   valid.rows == rows,
               "per-row lengths for %lld rows", static_cast<long long>(rows));
  }
}

// Compares validation's verdict with the oracle's.
template <typename Plan>
bool Agree(const char* op, const absl::StatusOr<Plan>& plan, bool expected) {
  if (!plan.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()), "%s: status %s", op,
               plan.status().ToString().c_str());
  }
  FUZZ_CHECK(plan.ok() == expected, "%s: validation %s, the oracle %s (%s)",
             op, plan.ok() ? "accepts" : "refuses",
             expected ? "accepts" : "refuses",
             plan.ok() ? "" : plan.status().ToString().c_str());
  return plan.ok();
}

bool SmallWork(const Buffers& buffers, double work) {
  return buffers.all_backed && work <= kMaxWork;
}

// Rows of `width` weights: zero from limit(row) on, summing to 1 (or all
// zero).
template <typename Limit>
void CheckWeights(const std::vector<float>& w, int64_t rows, int64_t width,
                  Limit limit) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t valid = limit(r);
    double sum = 0.0;
    for (int64_t j = 0; j < width; ++j) {
      const float value = w[r * width + j];
      FUZZ_CHECK(j < valid || value == 0.0f,
                 "weight (%lld, %lld) past valid length %lld is %g",
                 static_cast<long long>(r), static_cast<long long>(j),
                 static_cast<long long>(valid), static_cast<double>(value));
      sum += value;
    }
    FUZZ_CHECK(valid == 0 ? sum == 0.0 : std::fabs(sum - 1.0) < 1e-3,
               "weights row %lld (valid %lld) sums to %g",
               static_cast<long long>(r), static_cast<long long>(valid), sum);
  }
}

attn::Precision MakePrecision(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      return attn::Precision::kFloat32;
    case 1:
      return attn::Precision::kBFloat16;
    default:
      return attn::Precision::kFloat16;
  }
}

// The reduced precisions' range checks read every element: only for backed
// tensors.
attn::Precision SafePrecision(FuzzedDataProvider& p, const Buffers& buffers) {
  const attn::Precision precision = MakePrecision(p);
  return precision != attn::Precision::kFloat32 && !buffers.all_backed
             ? attn::Precision::kFloat32
             : precision;
}

void MaskedSoftmax(FuzzedDataProvider& p, const int64_t* s, Buffers& buffers) {
  attn::MaskedSoftmaxRequest request;
  request.x = buffers.Tensor(p, MakeShape(p, s, {kB, kLq, kLk}));
  request.valid_lens = buffers.Lengths(p, s);
  const auto plan = attn::ValidateMaskedSoftmax(request);
  const Shape& x = request.x.shape;
  const bool expected =
      Good(request.x, 3, 3) && GoodLengths(request.valid_lens, x[0], x[1], x[2]);
  if (!Agree("masked_softmax", plan, expected)) return;
  const attn::MaskedSoftmaxParams& params = plan->params;
  FUZZ_CHECK(params.x == request.x.data && params.batch == x[0] &&
                 params.rows == x[1] && params.columns == x[2] &&
                 params.out == nullptr,
             "masked_softmax params");
  CheckPlanLengths(params.valid, request.valid_lens, x[1]);
  FUZZ_CHECK(plan->output_shape == x && plan->weights_shape.empty(),
             "masked_softmax output %s", Str(plan->output_shape).c_str());
  const int64_t n = *ElementCount(x);
  if (!SmallWork(buffers, 5.0 * n)) return;
  std::vector<float> out(n);
  attn::MaskedSoftmaxParams run = params;
  run.out = out.data();
  FUZZ_CHECK(attn::ReferenceBackend().MaskedSoftmax(run).ok(), "reference");
  CheckWeights(out, x[0] * x[1], x[2], [&](int64_t r) {
    return run.valid.Limit(r / x[1], r % x[1], x[2]);
  });
}

void BatchMatmul(FuzzedDataProvider& p, const int64_t* s, Buffers& buffers) {
  attn::BatchMatmulRequest request;
  request.a = buffers.Tensor(p, MakeShape(p, s, {kB, kLq, kD}));
  request.b = buffers.Tensor(p, MakeShape(p, s, {kB, kD, kV}));
  request.precision = SafePrecision(p, buffers);
  const auto plan = attn::ValidateBatchMatmul(request);
  const Shape& a = request.a.shape;
  const Shape& b = request.b.shape;
  const bool shapes = Good(request.a, 3, 3) && Good(request.b, 3, 3) &&
                      b[0] == a[0] && b[1] == a[2];
  const bool expected = shapes && InFloat16Range(request.a, request.precision) &&
                        InFloat16Range(request.b, request.precision) &&
                        ElementCount(Shape{a[0], a[1], b[2]}).has_value();
  if (!Agree("batch_matmul", plan, expected)) return;
  const attn::BatchMatmulParams& params = plan->params;
  FUZZ_CHECK(params.a == request.a.data && params.b == request.b.data &&
                 params.n == a[0] && params.m == a[1] && params.k == a[2] &&
                 params.p == b[2] && params.precision == request.precision,
             "batch_matmul params");
  FUZZ_CHECK(plan->output_shape == Shape({a[0], a[1], b[2]}),
             "batch_matmul output %s", Str(plan->output_shape).c_str());
  const double work = 2.0 * a[0] * a[1] * a[2] * b[2];
  if (!SmallWork(buffers, work)) return;
  std::vector<float> out(*ElementCount(plan->output_shape));
  attn::BatchMatmulParams run = params;
  run.out = out.data();
  FUZZ_CHECK(attn::ReferenceBackend().BatchMatmul(run).ok(), "reference");
}

std::optional<float> MakeScale(FuzzedDataProvider& p) {
  if (p.ConsumeBool()) return std::nullopt;
  return EdgeFloat(p);
}

void ScaledDotProductAttention(FuzzedDataProvider& p, const int64_t* s,
                               Buffers& buffers) {
  attn::AttentionRequest request;
  if (p.ConsumeBool()) {
    request.queries = buffers.Tensor(p, MakeShape(p, s, {kB, kH, kLq, kD}));
    request.keys = buffers.Tensor(p, MakeShape(p, s, {kB, kH, kLk, kD}));
    request.values = buffers.Tensor(p, MakeShape(p, s, {kB, kH, kLk, kV}));
  } else {
    request.queries = buffers.Tensor(p, MakeShape(p, s, {kB, kLq, kD}));
    request.keys = buffers.Tensor(p, MakeShape(p, s, {kB, kLk, kD}));
    request.values = buffers.Tensor(p, MakeShape(p, s, {kB, kLk, kV}));
  }
  request.valid_lens = buffers.Lengths(p, s);
  request.causal = p.ConsumeBool();
  request.scale = MakeScale(p);
  request.score =
      p.ConsumeBool() ? attn::ScoreKind::kGaussian : attn::ScoreKind::kDotProduct;
  request.return_weights = p.ConsumeBool();
  request.precision = SafePrecision(p, buffers);
  const auto plan = attn::ValidateAttention(request);

  const Shape& q = request.queries.shape;
  const Shape& k = request.keys.shape;
  const Shape& v = request.values.shape;
  const size_t rank = q.size();
  bool expected = Good(request.queries, 3, 4) && Good(request.keys, rank, rank) &&
                  Good(request.values, rank, rank);
  if (expected) {
    for (size_t axis = 0; axis + 2 < rank; ++axis) {
      expected = expected && k[axis] == q[axis];
    }
    expected = expected && k[rank - 1] == q[rank - 1];
    for (size_t axis = 0; axis + 1 < rank; ++axis) {
      expected = expected && v[axis] == k[axis];
    }
  }
  Shape out, weights;
  if (expected) {
    expected = InFloat16Range(request.queries, request.precision) &&
               InFloat16Range(request.keys, request.precision) &&
               InFloat16Range(request.values, request.precision) &&
               (!request.scale.has_value() || PositiveFinite(*request.scale)) &&
               GoodLengths(request.valid_lens, q[0], q[rank - 2], k[rank - 2]);
    out = q;
    out.back() = v.back();
    if (request.return_weights) {
      weights = q;
      weights.back() = k[rank - 2];
    }
    expected = expected && ElementCount(out).has_value() &&
               (weights.empty() || ElementCount(weights).has_value());
  }
  if (!Agree("attention", plan, expected)) return;

  const attn::AttentionParams& params = plan->params;
  const int64_t heads = rank == 4 ? q[1] : 1;
  const int64_t lq = q[rank - 2], lk = k[rank - 2], d = q[rank - 1];
  const float scale =
      request.scale.has_value()
          ? *request.scale
          : (request.score == attn::ScoreKind::kDotProduct
                 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))
                 : 1.0f);
  FUZZ_CHECK(params.q == request.queries.data && params.k == request.keys.data &&
                 params.v == request.values.data && params.batch == q[0] &&
                 params.heads == heads && params.lq == lq && params.lk == lk &&
                 params.d == d && params.dv == v.back() &&
                 params.causal == request.causal &&
                 params.score == request.score &&
                 params.precision == request.precision && params.scale == scale,
             "attention params");
  CheckPlanLengths(params.valid, request.valid_lens, lq);
  FUZZ_CHECK(plan->output_shape == out && plan->weights_shape == weights,
             "attention output %s, weights %s", Str(plan->output_shape).c_str(),
             Str(plan->weights_shape).c_str());
  const double work = 2.0 * q[0] * heads * lq * lk * (d + v.back());
  if (!SmallWork(buffers, work)) return;
  std::vector<float> out_buffer(*ElementCount(out));
  std::vector<float> weights_buffer(weights.empty() ? 0 : *ElementCount(weights));
  attn::AttentionParams run = params;
  run.out = out_buffer.data();
  run.weights = weights.empty() ? nullptr : weights_buffer.data();
  FUZZ_CHECK(attn::ReferenceBackend().ScaledDotProductAttention(run).ok(),
             "reference");
  if (!weights.empty()) {
    CheckWeights(weights_buffer, q[0] * heads * lq, lk, [&](int64_t r) {
      return run.KeyLimit(r / (heads * lq), r % lq);
    });
  }
}

void AdditiveAttention(FuzzedDataProvider& p, const int64_t* s,
                       Buffers& buffers) {
  attn::AdditiveAttentionRequest request;
  request.queries = buffers.Tensor(p, MakeShape(p, s, {kB, kLq, kD}));
  request.keys = buffers.Tensor(p, MakeShape(p, s, {kB, kLk, kDk}));
  request.values = buffers.Tensor(p, MakeShape(p, s, {kB, kLk, kV}));
  request.w_q = buffers.Tensor(p, MakeShape(p, s, {kHidden, kD}));
  request.w_k = buffers.Tensor(p, MakeShape(p, s, {kHidden, kDk}));
  request.w_v = buffers.Tensor(p, MakeShape(p, s, {kHidden}));
  request.valid_lens = buffers.Lengths(p, s);
  request.return_weights = p.ConsumeBool();
  const auto plan = attn::ValidateAdditiveAttention(request);

  const Shape& q = request.queries.shape;
  const Shape& k = request.keys.shape;
  const Shape& v = request.values.shape;
  const Shape& w_q = request.w_q.shape;
  const Shape& w_k = request.w_k.shape;
  const Shape& w_v = request.w_v.shape;
  bool expected = Good(request.queries, 3, 3) && Good(request.keys, 3, 3) &&
                  Good(request.values, 3, 3) && Good(request.w_q, 2, 2) &&
                  Good(request.w_k, 2, 2) && Good(request.w_v, 1, 1);
  Shape out, weights;
  if (expected) {
    expected = k[0] == q[0] && v[0] == q[0] && v[1] == k[1] && w_q[1] == q[2] &&
               w_k[0] == w_q[0] && w_k[1] == k[2] && w_v[0] == w_q[0] &&
               GoodLengths(request.valid_lens, q[0], q[1], k[1]);
    out = {q[0], q[1], v[2]};
    if (request.return_weights) weights = {q[0], q[1], k[1]};
    expected = expected && ElementCount(out).has_value() &&
               (weights.empty() || ElementCount(weights).has_value());
  }
  if (!Agree("additive_attention", plan, expected)) return;

  const attn::AdditiveAttentionParams& params = plan->params;
  FUZZ_CHECK(params.q == request.queries.data && params.k == request.keys.data &&
                 params.v == request.values.data &&
                 params.w_q == request.w_q.data &&
                 params.w_k == request.w_k.data &&
                 params.w_v == request.w_v.data && params.batch == q[0] &&
                 params.lq == q[1] && params.lk == k[1] && params.dq == q[2] &&
                 params.dk == k[2] && params.h == w_q[0] && params.dv == v[2],
             "additive_attention params");
  CheckPlanLengths(params.valid, request.valid_lens, q[1]);
  FUZZ_CHECK(plan->output_shape == out && plan->weights_shape == weights,
             "additive_attention output %s, weights %s",
             Str(plan->output_shape).c_str(), Str(plan->weights_shape).c_str());
  const double work = 2.0 * q[0] * q[1] * k[1] * (w_q[0] + v[2]) +
                      2.0 * w_q[0] * (q[0] * q[1] * q[2] + k[0] * k[1] * k[2]);
  if (!SmallWork(buffers, work)) return;
  std::vector<float> out_buffer(*ElementCount(out));
  std::vector<float> weights_buffer(weights.empty() ? 0 : *ElementCount(weights));
  attn::AdditiveAttentionParams run = params;
  run.out = out_buffer.data();
  run.weights = weights.empty() ? nullptr : weights_buffer.data();
  FUZZ_CHECK(attn::ReferenceBackend().AdditiveAttention(run).ok(), "reference");
  if (!weights.empty()) {
    CheckWeights(weights_buffer, q[0] * q[1], k[1], [&](int64_t r) {
      return run.valid.Limit(r / q[1], r % q[1], k[1]);
    });
  }
}

// The training pairs of a regression: x (n,) or (n, dx), y (n,) or (n, dy).
bool GoodPairs(const attn::TensorView& x, const attn::TensorView& y) {
  return Good(x, 1, 2) && Good(y, 1, 2) && y.shape[0] == x.shape[0];
}

void CheckPairs(const attn::NadarayaWatsonParams& params,
                const attn::TensorView& x, const attn::TensorView& y) {
  FUZZ_CHECK(params.x_train == x.data && params.y_train == y.data &&
                 params.n_train == x.shape[0] &&
                 params.dx == (x.shape.size() == 2 ? x.shape[1] : 1) &&
                 params.dy == (y.shape.size() == 2 ? y.shape[1] : 1),
             "training pairs params");
}

attn::TensorView RegressionInput(FuzzedDataProvider& p, const int64_t* s,
                                 Buffers& buffers, Symbol rows, Symbol columns) {
  return p.ConsumeBool() ? buffers.Tensor(p, MakeShape(p, s, {rows}))
                         : buffers.Tensor(p, MakeShape(p, s, {rows, columns}));
}

void NadarayaWatson(FuzzedDataProvider& p, const int64_t* s, Buffers& buffers) {
  attn::NadarayaWatsonRequest request;
  request.x_train = RegressionInput(p, s, buffers, kLk, kD);
  request.y_train = RegressionInput(p, s, buffers, kLk, kV);
  request.x_query = RegressionInput(p, s, buffers, kLq, kD);
  request.kernel = static_cast<attn::RegressionKernel>(p.ConsumeIntegralInRange<int>(0, 3));
  request.bandwidth = p.ConsumeBool() ? 1.0f : EdgeFloat(p);
  request.return_weights = p.ConsumeBool();
  const auto plan = attn::ValidateNadarayaWatson(request);

  const Shape& x = request.x_train.shape;
  const Shape& y = request.y_train.shape;
  const Shape& m = request.x_query.shape;
  bool expected = GoodPairs(request.x_train, request.y_train) &&
                  Good(request.x_query, x.size(), x.size());
  Shape out, weights;
  if (expected) {
    expected = (x.size() == 1 || m[1] == x[1]) &&
               PositiveFinite(request.bandwidth);
    out = y.size() == 1 ? Shape{m[0]} : Shape{m[0], y[1]};
    if (request.return_weights) weights = {m[0], x[0]};
    expected = expected && ElementCount(out).has_value() &&
               (weights.empty() || ElementCount(weights).has_value());
  }
  if (!Agree("nadaraya_watson", plan, expected)) return;

  const attn::NadarayaWatsonParams& params = plan->params;
  CheckPairs(params, request.x_train, request.y_train);
  FUZZ_CHECK(params.x_query == request.x_query.data && params.n_query == m[0] &&
                 params.kernel == request.kernel &&
                 params.bandwidth == request.bandwidth,
             "nadaraya_watson params");
  FUZZ_CHECK(plan->output_shape == out && plan->weights_shape == weights,
             "nadaraya_watson output %s, weights %s",
             Str(plan->output_shape).c_str(), Str(plan->weights_shape).c_str());
  const double work = 2.0 * m[0] * x[0] * (params.dx + params.dy);
  if (!SmallWork(buffers, work)) return;
  std::vector<float> out_buffer(*ElementCount(out));
  std::vector<float> weights_buffer(weights.empty() ? 0 : *ElementCount(weights));
  attn::NadarayaWatsonParams run = params;
  run.out = out_buffer.data();
  run.weights = weights.empty() ? nullptr : weights_buffer.data();
  FUZZ_CHECK(attn::ReferenceBackend().NadarayaWatson(run).ok(), "reference");
  if (!weights.empty()) {
    for (int64_t r = 0; r < m[0]; ++r) {
      double sum = 0.0;
      for (int64_t j = 0; j < x[0]; ++j) sum += weights_buffer[r * x[0] + j];
      FUZZ_CHECK(sum == 0.0 || std::fabs(sum - 1.0) < 1e-3,
                 "nadaraya_watson weights row %lld sums to %g",
                 static_cast<long long>(r), sum);
    }
  }
}

void FitBandwidth(FuzzedDataProvider& p, const int64_t* s, Buffers& buffers) {
  attn::FitBandwidthRequest request;
  request.x_train = RegressionInput(p, s, buffers, kLk, kD);
  request.y_train = RegressionInput(p, s, buffers, kLk, kV);
  if (p.ConsumeBool()) request.initial_bandwidth = EdgeFloat(p);
  if (p.ConsumeBool()) request.learning_rate = EdgeFloat(p);
  if (p.ConsumeBool()) {
    static constexpr int kEpochs[] = {0,      1,      2,         5,
                                      100000, 100001, -1,        INT32_MIN,
                                      INT32_MAX};
    request.epochs = p.PickValueInArray(kEpochs);
  }
  const auto plan = attn::ValidateFitBandwidth(request);
  const bool expected = GoodPairs(request.x_train, request.y_train) &&
                        request.x_train.shape[0] >= 2 &&
                        PositiveFinite(request.initial_bandwidth) &&
                        PositiveFinite(request.learning_rate) &&
                        request.epochs >= 1 && request.epochs <= 100000;
  if (!Agree("fit_bandwidth", plan, expected)) return;
  CheckPairs(plan->params, request.x_train, request.y_train);
  FUZZ_CHECK(plan->params.bandwidth == request.initial_bandwidth,
             "fit_bandwidth initial bandwidth");
  const int epochs = std::min(request.epochs, 3);
  const auto& params = plan->params;
  const double work =
      2.0 * epochs * params.n_train * params.n_train * (params.dx + params.dy);
  if (!SmallWork(buffers, work)) return;
  absl::StatusOr<attn::FitBandwidthResult> fit =
      attn::FitBandwidth(params, request.learning_rate, epochs);
  // A fit that diverges (a large learning rate) may be refused; one that is
  // not gives finite numbers (engine.h: finite inputs, finite results).
  if (!fit.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(fit.status()), "fit: %s",
               fit.status().ToString().c_str());
    return;
  }
  FUZZ_CHECK(static_cast<int>(fit->loss_per_epoch.size()) == epochs,
             "%zu losses for %d epochs", fit->loss_per_epoch.size(), epochs);
  FUZZ_CHECK(std::isfinite(fit->bandwidth) && fit->bandwidth > 0 &&
                 std::isfinite(fit->final_loss),
             "fit returned bandwidth %g, final loss %g (initial bandwidth %g, "
             "learning_rate %g, %d epochs, %lld points)",
             static_cast<double>(fit->bandwidth), fit->final_loss,
             static_cast<double>(request.initial_bandwidth),
             static_cast<double>(request.learning_rate), epochs,
             static_cast<long long>(params.n_train));
  for (double loss : fit->loss_per_epoch) {
    FUZZ_CHECK(std::isfinite(loss), "fit returned a loss of %g", loss);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  const int op = p.ConsumeIntegralInRange<int>(0, 5);
  int64_t symbols[kSymbols];
  for (int64_t& symbol : symbols) symbol = EdgeOrSmall(p);
  Buffers buffers;
  switch (op) {
    case 0:
      MaskedSoftmax(p, symbols, buffers);
      break;
    case 1:
      BatchMatmul(p, symbols, buffers);
      break;
    case 2:
      ScaledDotProductAttention(p, symbols, buffers);
      break;
    case 3:
      AdditiveAttention(p, symbols, buffers);
      break;
    case 4:
      NadarayaWatson(p, symbols, buffers);
      break;
    default:
      FitBandwidth(p, symbols, buffers);
      break;
  }
  return 0;
}
