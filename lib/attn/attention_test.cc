// Scaled dot-product (and Gaussian-score) attention: the optimized backend
// against the reference on seeded random shapes, and the textbook's toy case.
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attn/bfloat16.h"
#include "attn/cpu_isa.h"
#include "attn/engine.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AllClose;
using ::attn::testing::AllExactly;
using ::attn::testing::AttentionBounds;
using ::attn::testing::ErrorBounds;
using ::attn::testing::OptimizedEngine;
using ::attn::testing::RandomLengths;
using ::attn::testing::RandomNormal;
using ::attn::testing::RoundToBFloat16Bits;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::Threads;
using ::attn::testing::ViewOf;
using ::attn::testing::WithinBounds;

enum class Lengths { kNone, kPerBatch, kPerRow, kZeroAndFull };

struct Case {
  int64_t batch, heads, lq, lk, d, dv;
  Lengths lengths;
  bool causal;
  ScoreKind score;
  std::string label;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.label;
}

class AttentionTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    auto optimized = Engine::Create(EngineOptions{});
    ASSERT_TRUE(optimized.ok()) << optimized.status();
    optimized_ = std::move(optimized).value();
    EngineOptions without_columns;
    without_columns.skipped_cpu_implementations = {"cpu-columns"};
    without_columns_ = Engine::Create(without_columns).value();
    EngineOptions reference_options;
    reference_options.use_onednn = false;
    auto reference = Engine::Create(reference_options);
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = std::move(reference).value();
  }
  std::unique_ptr<Engine> optimized_;
  // The same with cpu-columns skipped: cpu-fused-blocks runs its calls.
  std::unique_ptr<Engine> without_columns_;
  std::unique_ptr<Engine> reference_;
};

// Whether cpu-columns takes the call without weights: float32 dot products
// of 64 rows or more over heads up to 64, in the avx512 copy of the
// kernels (which this process's cap, ATTN_MAX_CPU_ISA, may turn off).
bool ColumnsTake(int64_t lq, int64_t d, int64_t dv, ScoreKind score) {
  const auto isa = SelectCpuIsa(std::nullopt);
  return isa.ok() && *isa >= CpuIsa::kAvx512 &&
         score == ScoreKind::kDotProduct && lq >= 64 && d <= 64 && dv <= 64;
}

TEST_P(AttentionTest, MatchesReferenceWithAndWithoutWeights) {
  const Case& c = GetParam();
  std::mt19937 rng(1234 + c.lq * 7 + c.lk);
  const bool multi_head = c.heads > 1;
  auto shape = [&](int64_t length, int64_t depth) {
    return multi_head ? Shape{c.batch, c.heads, length, depth}
                      : Shape{c.batch, length, depth};
  };
  const Tensor q = RandomNormal(rng, shape(c.lq, c.d));
  const Tensor k = RandomNormal(rng, shape(c.lk, c.d));
  const Tensor v = RandomNormal(rng, shape(c.lk, c.dv));
  std::vector<int32_t> lengths;
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.causal = c.causal;
  request.score = c.score;
  switch (c.lengths) {
    case Lengths::kNone:
      break;
    case Lengths::kPerBatch:
      lengths = RandomLengths(rng, c.batch, 0, c.lk);
      request.valid_lens = ViewOf(lengths, {c.batch});
      break;
    case Lengths::kPerRow:
      lengths = RandomLengths(rng, c.batch * c.lq, 0, c.lk);
      request.valid_lens = ViewOf(lengths, {c.batch, c.lq});
      break;
    case Lengths::kZeroAndFull:
      for (int64_t b = 0; b < c.batch; ++b) {
        lengths.push_back(b % 2 == 0 ? 0 : static_cast<int32_t>(c.lk));
      }
      request.valid_lens = ViewOf(lengths, {c.batch});
      break;
  }
  request.return_weights = true;
  request.return_log_sum_exp = true;  // checked last, below
  auto expected = reference_->ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->implementation, "reference");
  request.return_log_sum_exp = false;
  auto with_weights = optimized_->ScaledDotProductAttention(request);
  ASSERT_TRUE(with_weights.ok()) << with_weights.status();
  EXPECT_EQ(with_weights->implementation, "cpu-weights-blocks");
  request.return_weights = false;
  auto fused = optimized_->ScaledDotProductAttention(request);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(fused->implementation, ColumnsTake(c.lq, c.d, c.dv, c.score)
                                       ? "cpu-columns"
                                       : "cpu-fused-blocks");
  EXPECT_TRUE(fused->weights.empty());
  auto blocks = without_columns_->ScaledDotProductAttention(request);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(blocks->implementation, "cpu-fused-blocks");

  // Bounds derived from the arithmetic (attn/testing/error_bounds.h), so
  // they hold whichever instruction set and blocking the backend uses.
  request.return_weights = true;
  const ErrorBounds bounds = AttentionBounds(request, *expected);
  EXPECT_TRUE(WithinBounds(with_weights->weights, expected->weights,
                           bounds.weights));
  EXPECT_TRUE(WithinBounds(with_weights->output, expected->output,
                           bounds.output));
  EXPECT_TRUE(WithinBounds(fused->output, expected->output, bounds.output));
  EXPECT_TRUE(WithinBounds(blocks->output, expected->output, bounds.output));

  // Masked positions get exactly zero weight; zero-length rows give zeros.
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t i = 0; i < c.lq; ++i) {
        int64_t limit = c.lk;
        if (!lengths.empty()) {
          limit = c.lengths == Lengths::kPerRow ? lengths[b * c.lq + i]
                                                : lengths[b];
        }
        if (c.causal) limit = std::min<int64_t>(limit, i + 1);
        const int64_t row = ((b * c.heads + h) * c.lq + i);
        ASSERT_TRUE(AllExactly(with_weights->weights, 0.0f,
                               row * c.lk + limit, (row + 1) * c.lk))
            << "row " << row << " limit " << limit;
        if (limit == 0) {
          ASSERT_TRUE(AllExactly(fused->output, 0.0f, row * c.dv,
                                 (row + 1) * c.dv));
          ASSERT_TRUE(AllExactly(blocks->output, 0.0f, row * c.dv,
                                 (row + 1) * c.dv));
        }
      }
    }
  }

  // Asked for the rows' log-sum-exp too (attn/pieces.h), with and without
  // the weights: the same answers, and the log-sum-exp within its bound of
  // the reference's; exactly -inf for a row with no key.
  request.return_log_sum_exp = true;
  for (const bool weights : {true, false}) {
    request.return_weights = weights;
    auto got = optimized_->ScaledDotProductAttention(request);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->implementation,
              weights ? "cpu-weights-blocks" : "cpu-key-shares");
    EXPECT_TRUE(WithinBounds(got->output, expected->output, bounds.output));
    if (weights) {
      EXPECT_TRUE(
          WithinBounds(got->weights, expected->weights, bounds.weights));
    }
    ASSERT_EQ(got->log_sum_exp.shape, expected->log_sum_exp.shape);
    EXPECT_TRUE(WithinBounds(got->log_sum_exp, expected->log_sum_exp,
                             bounds.log_sum_exp));
    for (size_t row = 0; row < expected->log_sum_exp.data.size(); ++row) {
      ASSERT_EQ(got->log_sum_exp.data[row] == -INFINITY,
                expected->log_sum_exp.data[row] == -INFINITY)
          << "row " << row << ": " << got->log_sum_exp.data[row];
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t,
                               int64_t>>
      shapes = {{1, 1, 1, 1, 1, 1},   {2, 1, 7, 7, 7, 7},
                {3, 1, 97, 257, 16, 8}, {2, 1, 257, 97, 8, 16},
                {1, 1, 300, 600, 64, 64}, {2, 3, 65, 130, 32, 24}};
  int index = 0;
  for (const auto& [b, h, lq, lk, d, dv] : shapes) {
    for (Lengths lengths : {Lengths::kNone, Lengths::kPerBatch,
                            Lengths::kPerRow, Lengths::kZeroAndFull}) {
      for (bool causal : {false, true}) {
        for (ScoreKind score : {ScoreKind::kDotProduct, ScoreKind::kGaussian}) {
          // Keep the suite quick: the Gaussian score on the smaller shapes.
          if (score == ScoreKind::kGaussian && lq * lk > 40000) continue;
          cases.push_back(
              {b, h, lq, lk, d, dv, lengths, causal, score,
               "case" + std::to_string(index++) + "_b" + std::to_string(b) +
                   "h" + std::to_string(h) + "q" + std::to_string(lq) + "k" +
                   std::to_string(lk) + "d" + std::to_string(d) + "v" +
                   std::to_string(dv) + (causal ? "_causal" : "") +
                   (score == ScoreKind::kGaussian ? "_gauss" : "")});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest, ::testing::ValuesIn(Cases()),
                         Name);

// The attention-scoring section's example: queries (2, 1, 2), keys
// (2, 10, 2), values (2, 10, 4) with valid lengths [2, 6]; weights past
// columns 2 and 6 are exactly zero, and with all keys equal (keys of ones)
// the weights are uniform over the valid prefix: 1/2 and 1/6.
TEST(AttentionToyTest, TextbookValidLengths) {
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  std::mt19937 rng(0);
  const Tensor queries = RandomNormal(rng, {2, 1, 2});
  Tensor keys = Tensor::Zeros({2, 10, 2});
  for (float& value : keys.data) value = 1.0f;
  Tensor values = Tensor::Zeros({2, 10, 4});
  for (size_t i = 0; i < values.data.size(); ++i) {
    values.data[i] = static_cast<float>(i % 40);  // the book's arange(40)
  }
  const std::vector<int32_t> lengths = {2, 6};
  AttentionRequest request;
  request.queries = queries.view();
  request.keys = keys.view();
  request.values = values.view();
  request.valid_lens = ViewOf(lengths, {2});
  request.return_weights = true;
  auto result = (*engine)->ScaledDotProductAttention(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->implementation, "cpu-weights-blocks");
  EXPECT_EQ(result->backend, "onednn-cpu");
  ASSERT_EQ(result->weights.shape, (Shape{2, 1, 10}));
  ASSERT_EQ(result->output.shape, (Shape{2, 1, 4}));
  EXPECT_TRUE(AllExactly(result->weights, 0.0f, 2, 10));
  EXPECT_TRUE(AllExactly(result->weights, 0.0f, 16, 20));
  for (int j = 0; j < 2; ++j) EXPECT_NEAR(result->weights.data[j], 0.5, 1e-6);
  for (int j = 0; j < 6; ++j) {
    EXPECT_NEAR(result->weights.data[10 + j], 1.0 / 6.0, 1e-6);
  }
  // Uniform weights average the valid value rows: batch 0 rows 0-1 of
  // arange(40).reshape(10, 4), batch 1 rows 0-5 of the same.
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(result->output.data[c], (c + (4 + c)) / 2.0, 1e-5);
    double mean = 0.0;
    for (int j = 0; j < 6; ++j) mean += (4 * j + c) / 6.0;
    EXPECT_NEAR(result->output.data[4 + c], mean, 1e-5);
  }
}

TEST(AttentionPrecisionTest, BFloat16WithinDocumentedBound) {
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  EngineOptions reference_options;
  reference_options.use_onednn = false;
  auto reference = Engine::Create(reference_options);
  ASSERT_TRUE(reference.ok());
  std::mt19937 rng(7);
  const Tensor q = RandomNormal(rng, {2, 128, 64});
  const Tensor k = RandomNormal(rng, {2, 200, 64});
  const Tensor v = RandomNormal(rng, {2, 200, 64});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.return_weights = true;
  auto exact = (*reference)->ScaledDotProductAttention(request);
  ASSERT_TRUE(exact.ok());
  request.precision = Precision::kBFloat16;
  auto bf16_reference = (*reference)->ScaledDotProductAttention(request);
  ASSERT_TRUE(bf16_reference.ok());
  for (bool weights : {true, false}) {
    request.return_weights = weights;
    auto bf16 = (*engine)->ScaledDotProductAttention(request);
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    // Against the reference fed the same bf16-rounded operands: float32
    // arithmetic only, within its derived bound.
    request.return_weights = true;
    EXPECT_TRUE(WithinBounds(bf16->output, bf16_reference->output,
                             AttentionBounds(request, *bf16_reference).output));
    // The documented bound against exact float32 inputs (docs/api.md, "bf16"):
    // each operand carries a relative rounding error <= 2^-8, so a score
    // q.k/sqrt(d) of unit normals moves by about 2^-8; weights by that much
    // relative, outputs by <= 2^-7 of max|v|. We allow 2^-5 absolute.
    EXPECT_TRUE(AllClose(bf16->output, exact->output, 1.0 / 32));
  }
}


// Whether the optimized engine multiplies bfloat16 in hardware here.
bool NativeBFloat16() {
  for (const std::string& description :
       OptimizedEngine(Threads::kDefault).backend_descriptions()) {
    if (description.find("bf16 attention: native") != std::string::npos) {
      return true;
    }
  }
  return false;
}

// Keys and values held as bfloat16 bits (a memory stored rounded), against
// the reference within the derived bounds, on the optimized engine with
// 37 query rows (oneDNN's bfloat16 products), 3 (widened to float32 a
// chunk at a time) and 1 (plain loops), and where
// bfloat16 products are emulated (the CPU or ONEDNN_MAX_CPU_ISA has none:
// held bits then go a block at a time, never widened whole). With native
// products they give exactly what the same values as floats give at
// bfloat16 precision; on the reference, always.
TEST(AttentionPrecisionTest, KeysAndValuesHeldAsBFloat16) {
  Engine& reference = ReferenceEngine();
  const bool native = NativeBFloat16();
  std::mt19937 rng(11);
  Tensor k = RandomNormal(rng, {2, 300, 64});
  Tensor v = RandomNormal(rng, {2, 300, 48});
  std::vector<uint16_t> k_bits = RoundToBFloat16Bits(k);
  std::vector<uint16_t> v_bits = RoundToBFloat16Bits(v);
  const std::vector<int32_t> lengths = {300, 123};
  for (const int64_t lq : {37, 3, 1}) {
    SCOPED_TRACE(::testing::Message() << "lq " << lq);
    const Tensor q = RandomNormal(rng, {2, lq, 64});
    for (ScoreKind score : {ScoreKind::kDotProduct, ScoreKind::kGaussian}) {
      AttentionRequest floats;
      floats.queries = q.view();
      floats.keys = k.view();
      floats.values = v.view();
      floats.valid_lens = LengthsView{lengths.data(), {2}};
      floats.score = score;
      floats.precision = Precision::kBFloat16;
      AttentionRequest held = floats;
      held.keys.data = nullptr;
      held.values.data = nullptr;
      held.keys_bfloat16 = k_bits.data();
      held.values_bfloat16 = v_bits.data();
      for (bool weights : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "score " << static_cast<int>(score)
                                          << ", weights " << weights);
        floats.return_weights = held.return_weights = weights;
        for (Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
          auto from_floats =
              OptimizedEngine(threads).ScaledDotProductAttention(floats);
          auto from_held =
              OptimizedEngine(threads).ScaledDotProductAttention(held);
          ASSERT_TRUE(from_floats.ok()) << from_floats.status();
          ASSERT_TRUE(from_held.ok()) << from_held.status();
          if (native) {
            EXPECT_EQ(from_held->output.data, from_floats->output.data);
            if (weights) {
              EXPECT_EQ(from_held->weights.data, from_floats->weights.data);
            }
          }
          // Against the reference within the derived bound. (The Gaussian
          // score's peaked weights found the bound's bfloat16 rounding of the
          // probabilities taken as 2^-9, half what it is.)
          floats.return_weights = true;
          auto expected = reference.ScaledDotProductAttention(floats);
          floats.return_weights = weights;
          ASSERT_TRUE(expected.ok());
          EXPECT_TRUE(WithinBounds(from_held->output, expected->output,
                                   AttentionBounds(floats, *expected).output));
        }
        auto reference_held = reference.ScaledDotProductAttention(held);
        auto reference_floats = reference.ScaledDotProductAttention(floats);
        ASSERT_TRUE(reference_held.ok()) << reference_held.status();
        ASSERT_TRUE(reference_floats.ok());
        EXPECT_EQ(reference_held->output.data, reference_floats->output.data);
      }
    }
  }

  // Refused: a mix of float32 data and bfloat16 bits, and another precision.
  const Tensor q = RandomNormal(rng, {2, 5, 64});
  AttentionRequest mixed;
  mixed.queries = q.view();
  mixed.keys = k.view();
  mixed.values = v.view();
  mixed.precision = Precision::kBFloat16;
  mixed.values_bfloat16 = v_bits.data();
  auto refused = reference.ScaledDotProductAttention(mixed);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not a mix"), std::string::npos);
  AttentionRequest float32 = mixed;
  float32.keys.data = nullptr;
  float32.values.data = nullptr;
  float32.keys_bfloat16 = k_bits.data();
  float32.precision = Precision::kFloat32;
  refused = reference.ScaledDotProductAttention(float32);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("precision: keys and values held "
                                            "as bfloat16 compute in bfloat16"),
            std::string::npos);
}

// Many keys (a stored memory's) and fewer query rows than a block: the key
// blocks' shape is compiled once the call has enough of them (float32 from
// 32 rows, bfloat16 from 5); within the derived bounds either way, with and
// without valid lengths.
TEST(AttentionPrecisionTest, LongKeysWithCompiledBlockShapes) {
  Engine& reference = ReferenceEngine();
  std::mt19937 rng(21);
  const Tensor k = RandomNormal(rng, {1, 4608, 64});
  const Tensor v = RandomNormal(rng, {1, 4608, 64});
  const std::vector<int32_t> lengths = {4500};
  for (const int64_t lq : {8, 40}) {
    const Tensor q = RandomNormal(rng, {1, lq, 64});
    for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
      for (bool masked : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "lq " << lq << ", " << PrecisionName(precision)
                     << (masked ? ", masked" : ""));
        AttentionRequest request;
        request.queries = q.view();
        request.keys = k.view();
        request.values = v.view();
        request.precision = precision;
        if (masked) request.valid_lens = LengthsView{lengths.data(), {1}};
        for (Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
          auto result = OptimizedEngine(threads).ScaledDotProductAttention(request);
          ASSERT_TRUE(result.ok()) << result.status();
          request.return_weights = true;
          auto expected = reference.ScaledDotProductAttention(request);
          ASSERT_TRUE(expected.ok());
          EXPECT_TRUE(WithinBounds(result->output, expected->output,
                                   AttentionBounds(request, *expected).output));
          request.return_weights = false;
        }
      }
    }
  }
}

// Keys and values as bfloat16 bits, for requests that hold them so.
struct HeldBits {
  std::vector<uint16_t> keys, values;
};
HeldBits BitsOf(const Tensor& k, const Tensor& v) {
  HeldBits bits{std::vector<uint16_t>(k.data.size()),
                std::vector<uint16_t>(v.data.size())};
  for (size_t i = 0; i < k.data.size(); ++i) bits.keys[i] = BFloat16Bits(k.data[i]);
  for (size_t i = 0; i < v.data.size(); ++i) bits.values[i] = BFloat16Bits(v.data[i]);
  return bits;
}

// `request` on the optimized engine, on two threads always and by default,
// within the derived bounds of the reference's result; in bfloat16, also
// with its keys and values held as `bits`, which gives the floats' result
// bit for bit where the CPU multiplies bfloat16 itself.
void ExpectWithinTheReferenceBounds(AttentionRequest request,
                                    const HeldBits& bits) {
  request.return_weights = true;
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const auto bounds = AttentionBounds(request, *expected).output;
  request.return_weights = false;
  AttentionRequest held = request;
  held.keys.data = held.values.data = nullptr;
  held.keys_bfloat16 = bits.keys.data();
  held.values_bfloat16 = bits.values.data();
  for (Threads threads : {Threads::kAlwaysParallel, Threads::kDefault}) {
    auto result = OptimizedEngine(threads).ScaledDotProductAttention(request);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE(WithinBounds(result->output, expected->output, bounds));
    if (request.precision != Precision::kBFloat16) continue;
    auto from_held = OptimizedEngine(threads).ScaledDotProductAttention(held);
    ASSERT_TRUE(from_held.ok()) << from_held.status();
    if (NativeBFloat16()) {
      ASSERT_EQ(from_held->output.data, result->output.data);
    }
    ASSERT_TRUE(WithinBounds(from_held->output, expected->output, bounds));
  }
}

// Calls of 2-64 query rows over many keys (a stored memory's batched
// queries) run with the rows as vector lanes (internal/cpu/lane_attention.h):
// float32, and bfloat16 where the CPU multiplies it (floats rounded per call,
// and keys and values held as bits, which must give the same values).
// Against the reference within the derived bounds: row counts on either
// side of each vector width and register tile (and 130 = a full query block
// plus two rows, which take other paths), key counts off the key block,
// value widths whole and not whole vectors, query depths odd and even, valid
// lengths per batch entry and per query (zero, within the first block,
// mid-block, all), both scores, two batch entries.
TEST(AttentionPrecisionTest, FewRowsOverManyKeysAsLanes) {
  struct Shape {
    int64_t d, dv, lk;
  };
  for (const Shape shape : {Shape{64, 64, 4096 + 37}, Shape{13, 48, 4352},
                            Shape{64, 16, 4096}, Shape{6, 80, 4133}}) {
    std::mt19937 rng(shape.d * 1000 + shape.dv);
    const Tensor k = RandomNormal(rng, {2, shape.lk, shape.d});
    const Tensor v = RandomNormal(rng, {2, shape.lk, shape.dv});
    const HeldBits bits = BitsOf(k, v);
    for (const int64_t lq : {2, 9, 17, 33, 64, 130}) {
      if (lq == 130 && shape.lk != 4096 + 37) continue;  // once is enough
      const Tensor q = RandomNormal(rng, {2, lq, shape.d});
      std::vector<int32_t> per_query(2 * lq);
      const int32_t lk = static_cast<int32_t>(shape.lk);
      const std::vector<int32_t> picks = {lk, 0, 100, lk - 1, 2500,
                                          std::min(4100, lk), 1};
      for (size_t i = 0; i < per_query.size(); ++i) {
        per_query[i] = picks[i % picks.size()];
      }
      const std::vector<int32_t> per_batch = {lk - 300, lk};
      for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
        for (ScoreKind score : {ScoreKind::kDotProduct, ScoreKind::kGaussian}) {
          for (int masks = 0; masks < 3; ++masks) {
            // The Gaussian score with per-query lengths only, and bfloat16
            // without the per-batch lengths: the time goes to the reference.
            if (score == ScoreKind::kGaussian && masks != 2) continue;
            if (precision == Precision::kBFloat16 && masks == 1) continue;
            SCOPED_TRACE(::testing::Message()
                         << "d " << shape.d << ", dv " << shape.dv << ", lk "
                         << shape.lk << ", lq " << lq << ", "
                         << PrecisionName(precision)
                         << (score == ScoreKind::kGaussian ? ", gaussian" : "")
                         << ", masks " << masks);
            AttentionRequest request;
            request.queries = q.view();
            request.keys = k.view();
            request.values = v.view();
            request.score = score;
            request.precision = precision;
            if (masks == 1) request.valid_lens = ViewOf(per_batch, {2});
            if (masks == 2) request.valid_lens = ViewOf(per_query, {2, lq});
            ASSERT_NO_FATAL_FAILURE(
                ExpectWithinTheReferenceBounds(request, bits));
          }
        }
      }
    }
  }
}

// Calls with fewer tasks than threads over many keys share each task's keys
// out among the threads and merge the shares' partial softmaxes: one batch
// entry of 1, 3, 17 and 130 rows (the last two tasks, one of two rows) over
// two to three shares; valid lengths that end in the first share, at a share
// boundary, in the last, and zero; both scores; float32, bfloat16 and keys
// and values held as bits. Against the reference within the derived bounds,
// on two threads always, and by default (calls under its threshold on one
// thread: no shares).
TEST(AttentionPrecisionTest, KeySharesMergeToTheReference) {
  for (const int64_t lk : {int64_t{8192 + 37}, int64_t{3 * 4096 + 256}}) {
    std::mt19937 rng(static_cast<uint32_t>(lk));
    const Tensor k = RandomNormal(rng, {1, lk, 64});
    const Tensor v = RandomNormal(rng, {1, lk, 64});
    const HeldBits bits = BitsOf(k, v);
    for (const int64_t lq : {1, 3, 17, 130}) {
      const Tensor q = RandomNormal(rng, {1, lq, 64});
      const int32_t keys = static_cast<int32_t>(lk);
      const std::vector<int32_t> picks = {keys, 100, 4096, keys - 5, 0, 5000};
      std::vector<int32_t> per_query(lq);
      for (int64_t i = 0; i < lq; ++i) per_query[i] = picks[i % picks.size()];
      for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
        for (ScoreKind score : {ScoreKind::kDotProduct, ScoreKind::kGaussian}) {
          for (bool masked : {false, true}) {
            if (score == ScoreKind::kGaussian && !masked) continue;
            SCOPED_TRACE(::testing::Message()
                         << "lk " << lk << ", lq " << lq << ", "
                         << PrecisionName(precision)
                         << (score == ScoreKind::kGaussian ? ", gaussian" : "")
                         << (masked ? ", masked" : ""));
            AttentionRequest request;
            request.queries = q.view();
            request.keys = k.view();
            request.values = v.view();
            request.score = score;
            request.precision = precision;
            if (masked) request.valid_lens = ViewOf(per_query, {1, lq});
            ASSERT_NO_FATAL_FAILURE(
                ExpectWithinTheReferenceBounds(request, bits));
          }
        }
      }
    }
  }
}

// Scores past float range over many keys, in lanes: q = 1e19 and two keys
// of 1e19 and 0.9e19 give scores of 6.4e39 and 5.8e39, which overflow in
// float32. The engine must not return the NaN this makes; in double the
// softmax is exactly one-hot on the first of the two. A third row sees only
// zero keys (valid length 500) and gets their values' plain mean.
TEST(AttentionOverflowTest, ManyKeysAsLanesGiveTheReferenceResult) {
  constexpr int64_t kD = 64, kKeys = 4096, kDv = 16;
  Tensor q = Tensor::Zeros({1, 3, kD});
  Tensor k = Tensor::Zeros({1, kKeys, kD});
  for (float& value : q.data) value = 1e19f;
  for (int64_t i = 0; i < kD; ++i) {
    k.data[1000 * kD + i] = 1e19f;
    k.data[3000 * kD + i] = 0.9e19f;
  }
  std::mt19937 rng(4);
  const Tensor v = RandomNormal(rng, {1, kKeys, kDv});
  const std::vector<int32_t> lengths = {kKeys, 2000, 500};
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.valid_lens = ViewOf(lengths, {1, 3});
  auto result =
      OptimizedEngine(Threads::kDefault).ScaledDotProductAttention(request);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t c = 0; c < kDv; ++c) {
      EXPECT_EQ(result->output.data[row * kDv + c], v.data[1000 * kDv + c])
          << "row " << row << " column " << c;
    }
  }
  for (int64_t c = 0; c < kDv; ++c) {
    double mean = 0.0;
    for (int64_t j = 0; j < 500; ++j) mean += v.data[j * kDv + c];
    EXPECT_NEAR(result->output.data[2 * kDv + c], mean / 500, 1e-5);
  }
}

TEST(AttentionPrecisionTest, Float16WithinDocumentedBound) {
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  EngineOptions reference_options;
  reference_options.use_onednn = false;
  auto reference = Engine::Create(reference_options);
  ASSERT_TRUE(reference.ok());
  std::mt19937 rng(8);
  const Tensor q = RandomNormal(rng, {2, 70, 32});
  const Tensor k = RandomNormal(rng, {2, 90, 32});
  const Tensor v = RandomNormal(rng, {2, 90, 16});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  auto exact = (*reference)->ScaledDotProductAttention(request);
  ASSERT_TRUE(exact.ok());
  request.precision = Precision::kFloat16;
  auto fp16 = (*engine)->ScaledDotProductAttention(request);
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  request.return_weights = true;
  auto fp16_reference = (*reference)->ScaledDotProductAttention(request);
  ASSERT_TRUE(fp16_reference.ok());
  EXPECT_TRUE(WithinBounds(fp16->output, fp16_reference->output,
                           AttentionBounds(request, *fp16_reference).output));
  // float16 keeps 11 significant bits (relative rounding <= 2^-11), eight
  // times finer than bfloat16: the bf16 argument above gives 2^-10 of
  // max|v|; we allow 2^-8 absolute. And the flag is not ignored.
  EXPECT_TRUE(AllClose(fp16->output, exact->output, 1.0 / 256));
  EXPECT_FALSE(AllClose(fp16->output, exact->output, 1e-6));
}

TEST(AttentionPrecisionTest, Float16RejectsInputsBeyondItsRange) {
  std::mt19937 rng(9);
  Tensor q = RandomNormal(rng, {1, 4, 8});
  const Tensor k = RandomNormal(rng, {1, 5, 8});
  const Tensor v = RandomNormal(rng, {1, 5, 8});
  q.data[3] = 70000.0f;
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.precision = Precision::kFloat16;
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  auto result = (*engine)->ScaledDotProductAttention(request);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("queries"), std::string::npos);
  EXPECT_NE(result.status().message().find("65504"), std::string::npos);
  request.precision = Precision::kBFloat16;  // bfloat16 has float32's range
  EXPECT_TRUE((*engine)->ScaledDotProductAttention(request).ok());
}

// ... all but its top: float's largest values round past bfloat16's largest
// finite one (~3.3895e38) to infinity, which made NaN from finite inputs
// (found by fuzz/typed_request). They are refused; the largest value that
// rounds to a finite bfloat16 is accepted.
TEST(AttentionPrecisionTest, BFloat16RejectsInputsThatRoundToInfinity) {
  std::mt19937 rng(10);
  Tensor q = RandomNormal(rng, {1, 4, 8});
  Tensor k = RandomNormal(rng, {1, 5, 8});
  const Tensor v = RandomNormal(rng, {1, 5, 8});
  k.data[6] = 3.4e38f;
  ASSERT_TRUE(std::isinf(RoundToBFloat16(k.data[6])));
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.precision = Precision::kBFloat16;
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  auto result = (*engine)->ScaledDotProductAttention(request);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("keys: element 6"),
            std::string::npos)
      << result.status();
  k.data[6] = 3.3e38f;
  ASSERT_TRUE(std::isfinite(RoundToBFloat16(k.data[6])));
  request.keys = k.view();
  EXPECT_TRUE((*engine)->ScaledDotProductAttention(request).ok());
}

TEST(EngineWarmUpTest, RunsEveryOperation) {
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  EXPECT_TRUE((*engine)->WarmUp().ok());
}

// Scores beyond float range from finite inputs must not come back as NaN.
// q = 1e19 everywhere and key j = c_j * 1e19 give scores 8e38 * c_j: past
// float's 3.4e38 for the largest c_j in any summation order, so a float32
// kernel overflows on every CPU, while in double (the reference, which the
// engine falls back to; the fallback itself is proved in engine_test.cc) the
// scores are so far apart that the softmax is exactly one-hot. Two rows of
// batch entry 1 see key 0 alone (score 4e38, past float range too).
TEST(AttentionOverflowTest, FiniteInputsGiveTheReferenceResult) {
  constexpr int64_t kD = 64, kKeys = 6, kDv = 8;
  const std::vector<float> c = {0.5f, 1.0f, -1.0f, 0.9f, 0.0f, 0.95f};
  Tensor q = Tensor::Zeros({2, 3, kD});
  Tensor k = Tensor::Zeros({2, kKeys, kD});
  std::mt19937 rng(3);
  const Tensor v = RandomNormal(rng, {2, kKeys, kDv});
  for (float& value : q.data) value = 1e19f;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < kKeys; ++j) {
      for (int64_t i = 0; i < kD; ++i) k.data[(b * kKeys + j) * kD + i] = c[j] * 1e19f;
    }
  }
  const std::vector<int32_t> lengths = {6, 6, 6, 1, 1, 6};
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.valid_lens = ViewOf(lengths, {2, 3});
  request.return_weights = true;
  for (Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
    auto result = OptimizedEngine(threads).ScaledDotProductAttention(request);
    ASSERT_TRUE(result.ok()) << result.status();
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t winner = lengths[b * 3 + i] == 1 ? 0 : 1;
        for (int64_t j = 0; j < kKeys; ++j) {
          EXPECT_EQ(result->weights.data[(b * 3 + i) * kKeys + j],
                    j == winner ? 1.0f : 0.0f)
              << "b=" << b << " i=" << i << " j=" << j;
        }
        for (int64_t col = 0; col < kDv; ++col) {
          EXPECT_EQ(result->output.data[(b * 3 + i) * kDv + col],
                    v.data[(b * kKeys + winner) * kDv + col]);
        }
      }
    }
  }
}

// The same on the fused blocks (no weights, enough rows for them), which
// check the outputs they write in place of the engine's scan: an
// overflowed row is still found, and the call redone on the reference.
TEST(AttentionOverflowTest, FusedBlocksFindTheirOverflowedRows) {
  std::mt19937 rng(8);
  Tensor q = RandomNormal(rng, {2, 40, 64});
  Tensor k = RandomNormal(rng, {2, 50, 64});
  const Tensor v = RandomNormal(rng, {2, 50, 16});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  for (Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
    auto finite = OptimizedEngine(threads).ScaledDotProductAttention(request);
    ASSERT_TRUE(finite.ok()) << finite.status();
    ASSERT_EQ(finite->implementation, "cpu-fused-blocks");
  }
  for (int64_t c = 0; c < 64; ++c) {
    q.data[(40 + 7) * 64 + c] = 1e19f;
    k.data[(50 + 3) * 64 + c] = 1e19f;
  }
  request.queries = q.view();
  request.keys = k.view();
  auto expected = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (Threads threads : {Threads::kDefault, Threads::kAlwaysParallel}) {
    auto result = OptimizedEngine(threads).ScaledDotProductAttention(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output.data, expected->output.data);
  }
}

// Non-finite inputs are the caller's: they propagate to the rows they touch
// and no further.
TEST(AttentionOverflowTest, NonFiniteInputsPropagateToTheirRows) {
  std::mt19937 rng(5);
  Tensor q = RandomNormal(rng, {2, 4, 16});
  const Tensor k = RandomNormal(rng, {2, 6, 16});
  const Tensor v = RandomNormal(rng, {2, 6, 8});
  q.data[0] = std::numeric_limits<float>::quiet_NaN();  // batch 0, row 0
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  auto result =
      OptimizedEngine(Threads::kDefault).ScaledDotProductAttention(request);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int64_t c = 0; c < 8; ++c) EXPECT_TRUE(std::isnan(result->output.data[c]));
  for (size_t i = 8; i < result->output.data.size(); ++i) {
    ASSERT_TRUE(std::isfinite(result->output.data[i])) << i;
  }
}

}  // namespace
}  // namespace attn
