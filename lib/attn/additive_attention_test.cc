// The optimized additive (MLP) attention against the double-accumulating
// reference: score(q, k) = w_v . tanh(W_q q + W_k k), masked softmax over
// keys, weighted sum of values.
//
// Tolerances (derived per case from the data):
// - Score error. Each of the h terms w_v[u] * tanh(f_u) carries the float32
//   projection error of f_u = W_q q + W_k k (a few u32 = 2^-24 times
//   sum |w x|, ~1e-7 for the unit-variance features used here), the kernel's
//   tanh error (documented ~1e-7 absolute; tanh' <= 1 passes the projection
//   error through unamplified) and the float32 sum over u. We allow
//   eps_term = 3e-7 per term, so |ds| <= 3e-7 * sum_u |w_v[u]| (worst case:
//   every term's error with the same sign).
// - A softmax weight moves by at most p * 2 * max|ds| (to first order), on
//   top of the float softmax error of masked_softmax_test (2e-5 relative,
//   1e-6 absolute).
// - The output sum_j p_j v_j moves by at most sum_j |dp_j| |v_j| plus the
//   float32 accumulation of the value product, so its tolerance is
//   (2 max|ds| + 2e-5) * max|v| + 1e-6.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attn/engine.h"
#include "attn/ops.h"
#include "attn/reference.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/random.h"
#include "attn/validate.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AllClose;
using ::attn::testing::OptimizedEngine;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::Threads;
using ::attn::testing::AllExactly;
using ::attn::testing::RandomLengths;
using ::attn::testing::RandomNormal;
using ::attn::testing::ViewOf;

constexpr double kTermError = 3e-7;
constexpr double kSoftmaxRelTol = 2e-5;
constexpr double kAbsTol = 1e-6;
constexpr double kRowSumTol = 1e-5;


// The reference backend on the validated request; weights filled when the
// request asks for them.
OpResult Reference(const AdditiveAttentionRequest& request) {
  absl::StatusOr<OpResult> result = ReferenceEngine().AdditiveAttention(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : OpResult{};
}

OpResult Optimized(const AdditiveAttentionRequest& request, Threads threads) {
  absl::StatusOr<OpResult> result =
      OptimizedEngine(threads).AdditiveAttention(request);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return OpResult{};
  EXPECT_EQ(result->implementation, "cpu-additive");
  EXPECT_EQ(result->weights.empty(), !request.return_weights);
  return std::move(result).value();
}

// The inputs of one case, owning their data.
struct Inputs {
  Tensor queries, keys, values, w_q, w_k, w_v;
  std::vector<int32_t> lengths;
  Shape lengths_shape;  // empty: no valid lengths

  AdditiveAttentionRequest Request(bool return_weights) const {
    AdditiveAttentionRequest r;
    r.queries = queries.view();
    r.keys = keys.view();
    r.values = values.view();
    r.w_q = w_q.view();
    r.w_k = w_k.view();
    r.w_v = w_v.view();
    if (!lengths_shape.empty()) r.valid_lens = ViewOf(lengths, lengths_shape);
    r.return_weights = return_weights;
    return r;
  }

  int64_t Limit(int64_t b, int64_t i) const {
    if (lengths_shape.empty()) return keys.shape[1];
    if (lengths_shape.size() == 1) return lengths[b];
    return lengths[b * queries.shape[1] + i];
  }

  // max |score error| allowed (see the header comment).
  double ScoreTol() const {
    double sum = 0.0;
    for (float w : w_v.data) sum += std::fabs(w);
    return kTermError * sum;
  }
  double ValueMax() const {
    double max = 0.0;
    for (float v : values.data) max = std::max(max, std::fabs(double{v}));
    return max;
  }
  double WeightRelTol() const { return 2.0 * ScoreTol() + kSoftmaxRelTol; }
  double OutputTol() const {
    return (2.0 * ScoreTol() + kSoftmaxRelTol) * ValueMax() + kAbsTol;
  }
};

struct Dims {
  int64_t batch, lq, lk, dq, dk, h, dv;
};

void PrintTo(const Dims& d, std::ostream* os) {
  *os << "batch=" << d.batch << " lq=" << d.lq << " lk=" << d.lk
      << " dq=" << d.dq << " dk=" << d.dk << " h=" << d.h << " dv=" << d.dv;
}

enum class LengthsForm { kNone, kPerBatch, kPerRow };

// Random inputs with unit-variance projected features: W_q, W_k ~ N(0, 1/d)
// so that tanh works over its whole range rather than saturating.
Inputs MakeInputs(const Dims& d, LengthsForm form, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in;
  in.queries = RandomNormal(rng, {d.batch, d.lq, d.dq});
  in.keys = RandomNormal(rng, {d.batch, d.lk, d.dk});
  in.values = RandomNormal(rng, {d.batch, d.lk, d.dv});
  in.w_q = RandomNormal(rng, {d.h, d.dq}, 1.0f / std::sqrt(float(d.dq)));
  in.w_k = RandomNormal(rng, {d.h, d.dk}, 1.0f / std::sqrt(float(d.dk)));
  in.w_v = RandomNormal(rng, {d.h});
  const int32_t lk = static_cast<int32_t>(d.lk);
  if (form == LengthsForm::kPerBatch) {
    in.lengths = RandomLengths(rng, d.batch, 0, lk);
    in.lengths_shape = {d.batch};
  } else if (form == LengthsForm::kPerRow) {
    in.lengths = RandomLengths(rng, d.batch * d.lq, 0, lk);
    in.lengths_shape = {d.batch, d.lq};
  }
  // Always include the extremes 0 and lk when there are two or more lengths.
  if (in.lengths.size() >= 2) {
    in.lengths.front() = 0;
    in.lengths.back() = lk;
  }
  return in;
}

// Weights beyond each row's length are exactly 0; rows of positive length
// sum to 1; rows of length 0 are all zero, and so is their output row.
void ExpectMaskInvariants(const Inputs& in, const OpResult& result) {
  const int64_t batch = in.queries.shape[0], lq = in.queries.shape[1];
  const int64_t lk = in.keys.shape[1], dv = in.values.shape[2];
  for (float v : result.output.data) ASSERT_TRUE(std::isfinite(v)) << v;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < lq; ++i) {
      const int64_t row = b * lq + i;
      const int64_t limit = in.Limit(b, i);
      if (limit == 0) {
        EXPECT_TRUE(AllExactly(result.output, 0.0f, row * dv, (row + 1) * dv))
            << "output row (" << b << ", " << i << ") has length 0";
      }
      if (result.weights.empty()) continue;
      EXPECT_TRUE(AllExactly(result.weights, 0.0f, row * lk + limit,
                             (row + 1) * lk))
          << "weights row (" << b << ", " << i << "), length " << limit;
      if (limit == 0) continue;
      double sum = 0.0;
      for (int64_t j = 0; j < lk; ++j) sum += result.weights.data[row * lk + j];
      EXPECT_NEAR(sum, 1.0, kRowSumTol) << "row (" << b << ", " << i << ")";
    }
  }
}

std::string FormName(LengthsForm form) {
  switch (form) {
    case LengthsForm::kNone:
      return "NoLengths";
    case LengthsForm::kPerBatch:
      return "PerBatch";
    case LengthsForm::kPerRow:
      return "PerRow";
  }
  return "";
}

void PrintTo(LengthsForm form, std::ostream* os) { *os << FormName(form); }

using SweepParam = std::tuple<Dims, LengthsForm, Threads>;

class AdditiveAttentionSweepTest
    : public ::testing::TestWithParam<SweepParam> {};

TEST_P(AdditiveAttentionSweepTest, MatchesReferenceWithAndWithoutWeights) {
  const auto& [d, form, threads] = GetParam();
  const Inputs in = MakeInputs(
      d, form,
      static_cast<uint32_t>(99 + d.batch * 7 + d.lq * 11 + d.lk * 13 +
                            d.dq * 17 + d.dk * 19 + d.h * 23 + d.dv * 29 +
                            static_cast<int>(form)));
  const OpResult expected = Reference(in.Request(/*return_weights=*/true));
  ExpectMaskInvariants(in, expected);

  const OpResult with_weights = Optimized(in.Request(true), threads);
  ASSERT_EQ(with_weights.output.shape, (Shape{d.batch, d.lq, d.dv}));
  ASSERT_EQ(with_weights.weights.shape, (Shape{d.batch, d.lq, d.lk}));
  EXPECT_TRUE(AllClose(with_weights.weights, expected.weights, kAbsTol,
                       in.WeightRelTol()));
  EXPECT_TRUE(AllClose(with_weights.output, expected.output, in.OutputTol()));
  ExpectMaskInvariants(in, with_weights);

  const OpResult without_weights = Optimized(in.Request(false), threads);
  EXPECT_TRUE(without_weights.weights.empty());
  EXPECT_TRUE(
      AllClose(without_weights.output, expected.output, in.OutputTol()));
  ExpectMaskInvariants(in, without_weights);
  // Asking for the weights must not change the output beyond rounding.
  EXPECT_TRUE(AllClose(without_weights.output, with_weights.output,
                       2.0 * in.OutputTol()));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AdditiveAttentionSweepTest,
    ::testing::Combine(
        ::testing::Values(
            // batch, lq, lk, dq, dk, h, dv
            Dims{1, 1, 1, 1, 1, 1, 1}, Dims{7, 1, 1, 2, 3, 4, 1},
            Dims{2, 7, 97, 3, 5, 8, 4}, Dims{3, 97, 7, 5, 2, 16, 1},
            Dims{1, 5, 257, 4, 6, 3, 2}, Dims{2, 3, 9, 7, 3, 257, 5},
            Dims{1, 4, 33, 2, 9, 1, 97}, Dims{2, 17, 64, 20, 2, 10, 3}),
        ::testing::Values(LengthsForm::kNone, LengthsForm::kPerBatch,
                          LengthsForm::kPerRow),
        ::testing::Values(Threads::kDefault, Threads::kAlwaysParallel)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      const Dims& d = std::get<0>(info.param);
      return absl::StrCat(
          "b", d.batch, "_lq", d.lq, "_lk", d.lk, "_dq", d.dq, "_dk", d.dk,
          "_h", d.h, "_dv", d.dv, "_", FormName(std::get<1>(info.param)), "_",
          std::get<2>(info.param) == Threads::kDefault ? "Default"
                                                       : "Parallel");
    });

class AdditiveAttentionEdgeTest : public ::testing::TestWithParam<Threads> {};

TEST_P(AdditiveAttentionEdgeTest, ZeroLengthsGiveZeroOutputAndWeights) {
  const Dims d{3, 5, 11, 4, 6, 8, 7};
  for (LengthsForm form : {LengthsForm::kPerBatch, LengthsForm::kPerRow}) {
    Inputs in = MakeInputs(d, form, 5);
    std::fill(in.lengths.begin(), in.lengths.end(), 0);
    for (bool return_weights : {true, false}) {
      const OpResult result = Optimized(in.Request(return_weights), GetParam());
      EXPECT_TRUE(AllExactly(result.output, 0.0f, 0, d.batch * d.lq * d.dv));
      if (return_weights) {
        EXPECT_TRUE(
            AllExactly(result.weights, 0.0f, 0, d.batch * d.lq * d.lk));
      }
    }
  }
}

TEST_P(AdditiveAttentionEdgeTest, FullLengthsEqualNoLengths) {
  const Dims d{2, 7, 97, 3, 5, 8, 4};
  Inputs in = MakeInputs(d, LengthsForm::kNone, 6);
  const OpResult expected = Reference(in.Request(true));
  const OpResult unmasked = Optimized(in.Request(true), GetParam());
  for (LengthsForm form : {LengthsForm::kPerBatch, LengthsForm::kPerRow}) {
    Inputs full = in;
    full.lengths_shape = form == LengthsForm::kPerBatch
                             ? Shape{d.batch}
                             : Shape{d.batch, d.lq};
    full.lengths.assign(form == LengthsForm::kPerBatch ? d.batch
                                                       : d.batch * d.lq,
                        static_cast<int32_t>(d.lk));
    const OpResult masked = Optimized(full.Request(true), GetParam());
    EXPECT_TRUE(AllClose(masked.weights, expected.weights, kAbsTol,
                         in.WeightRelTol()));
    EXPECT_TRUE(AllClose(masked.output, expected.output, in.OutputTol()));
    EXPECT_TRUE(AllClose(masked.output, unmasked.output, 2 * in.OutputTol()));
  }
}

// Hand-derived: with w_v = 0 every score is 0, so the weights are uniform
// over the valid prefix (1 / length) and the output is the mean of the
// valid values. Values are chosen so the means are exact in float.
TEST_P(AdditiveAttentionEdgeTest, ZeroScoreVectorGivesUniformWeights) {
  const Dims d{2, 3, 4, 3, 2, 5, 2};
  Inputs in = MakeInputs(d, LengthsForm::kPerRow, 7);
  std::fill(in.w_v.data.begin(), in.w_v.data.end(), 0.0f);
  // values[b][j] = (j + 1, -2 (j + 1)) * (b + 1)
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t j = 0; j < d.lk; ++j) {
      in.values.data[(b * d.lk + j) * 2 + 0] = (j + 1.0f) * (b + 1);
      in.values.data[(b * d.lk + j) * 2 + 1] = -2.0f * (j + 1) * (b + 1);
    }
  }
  in.lengths = {4, 1, 2, 0, 3, 4};
  Tensor expected_out = Tensor::Zeros({d.batch, d.lq, d.dv});
  Tensor expected_weights = Tensor::Zeros({d.batch, d.lq, d.lk});
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t i = 0; i < d.lq; ++i) {
      const int64_t n = in.lengths[b * d.lq + i];
      for (int64_t j = 0; j < n; ++j) {
        expected_weights.data[(b * d.lq + i) * d.lk + j] = 1.0f / n;
      }
      // mean of 1..n is (n + 1) / 2
      const float mean = n == 0 ? 0.0f : (n + 1) / 2.0f * (b + 1);
      expected_out.data[(b * d.lq + i) * 2 + 0] = mean;
      expected_out.data[(b * d.lq + i) * 2 + 1] = -2.0f * mean;
    }
  }
  const OpResult actual = Optimized(in.Request(true), GetParam());
  EXPECT_TRUE(AllClose(actual.weights, expected_weights, 1e-7));
  EXPECT_TRUE(AllClose(actual.output, expected_out, 1e-6, 1e-6));
  const OpResult reference = Reference(in.Request(true));
  EXPECT_TRUE(AllClose(reference.weights, expected_weights, 1e-7));
  EXPECT_TRUE(AllClose(reference.output, expected_out, 1e-6, 1e-6));
}

// A large score vector (w_v * 1000: |score| up to ~1e4) makes the softmax
// nearly one-hot; nothing may overflow into NaN.
TEST_P(AdditiveAttentionEdgeTest, LargeScoresStayFinite) {
  const Dims d{2, 7, 33, 3, 5, 16, 4};
  Inputs in = MakeInputs(d, LengthsForm::kPerRow, 8);
  for (float& w : in.w_v.data) w *= 1000.0f;
  const OpResult expected = Reference(in.Request(true));
  const OpResult actual = Optimized(in.Request(true), GetParam());
  ExpectMaskInvariants(in, actual);
  for (float w : actual.weights.data) ASSERT_TRUE(std::isfinite(w));
  // The tolerances scale with sum |w_v| (see the header comment).
  EXPECT_TRUE(
      AllClose(actual.weights, expected.weights, kAbsTol, in.WeightRelTol()));
  EXPECT_TRUE(AllClose(actual.output, expected.output, in.OutputTol()));
}

INSTANTIATE_TEST_SUITE_P(Engines, AdditiveAttentionEdgeTest,
                         ::testing::Values(Threads::kDefault,
                                           Threads::kAlwaysParallel),
                         [](const ::testing::TestParamInfo<Threads>& info) {
                           return info.param == Threads::kDefault
                                      ? "Default"
                                      : "Parallel";
                         });

}  // namespace
}  // namespace attn
