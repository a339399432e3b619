// Bad inputs of every request type, sent through the Engine: each must come
// back INVALID_ARGUMENT (never a crash, never a backend running on it) with a
// message naming the offending argument and, for shape errors, the shape it
// got. The same requests go to the optimized engine and to a reference-only
// engine: validation happens before either backend sees anything.
#include "attn/validate.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "attn/engine.h"
#include "attn/ops.h"
#include "attn/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kHuge = int64_t{1} << 40;
// 2^16: two of these make an output of 2^32 elements, over the 2^31 - 1
// limit, while every input stays small enough to really allocate.
constexpr int64_t kWide = int64_t{1} << 16;

// Backing store for every view below. Shapes that fit it are real (so an
// accidentally accepted request reads only valid memory); the overflowing
// shapes are rejected before any element is read.
const float* Data() {
  static const std::vector<float>* const data =
      new std::vector<float>(4 * kWide, 0.25f);
  return data->data();
}

TensorView V(Shape shape) { return TensorView{Data(), std::move(shape)}; }
TensorView Null(Shape shape) { return TensorView{nullptr, std::move(shape)}; }

struct Engines {
  std::unique_ptr<Engine> optimized;
  std::unique_ptr<Engine> reference;
};

const Engines& GetEngines() {
  static const Engines* const engines = [] {
    auto* e = new Engines;
    auto optimized = Engine::Create(EngineOptions{});
    EngineOptions reference_options;
    reference_options.use_onednn = false;
    auto reference = Engine::Create(reference_options);
    if (optimized.ok()) e->optimized = std::move(optimized).value();
    if (reference.ok()) e->reference = std::move(reference).value();
    return e;
  }();
  return *engines;
}

// One bad request: `run` sends it to an engine; the status must be
// INVALID_ARGUMENT and its message must contain every string of `expect`.
struct BadCase {
  std::string name;
  std::function<absl::Status(Engine&)> run;
  std::vector<std::string> expect;
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) {
  return os << c.name;
}

// --- Request builders: a valid baseline per operation, then mutations. ---

// MaskedSoftmax baseline: x (2, 3, 4).
MaskedSoftmaxRequest Softmax() { return MaskedSoftmaxRequest{V({2, 3, 4}), {}}; }

// BatchMatmul baseline: (2, 3, 4) x (2, 4, 5).
BatchMatmulRequest Matmul() {
  BatchMatmulRequest r;
  r.a = V({2, 3, 4});
  r.b = V({2, 4, 5});
  return r;
}

// Attention baseline: queries (3, 5, 4), keys (3, 10, 4), values (3, 10, 6).
AttentionRequest Attn() {
  AttentionRequest r;
  r.queries = V({3, 5, 4});
  r.keys = V({3, 10, 4});
  r.values = V({3, 10, 6});
  return r;
}

// Additive baseline: queries (2, 3, 4), keys (2, 6, 5), values (2, 6, 7),
// w_q (8, 4), w_k (8, 5), w_v (8,).
AdditiveAttentionRequest Additive() {
  AdditiveAttentionRequest r;
  r.queries = V({2, 3, 4});
  r.keys = V({2, 6, 5});
  r.values = V({2, 6, 7});
  r.w_q = V({8, 4});
  r.w_k = V({8, 5});
  r.w_v = V({8});
  return r;
}

// Nadaraya-Watson baseline: x_train (10, 3), y_train (10, 2), x_query (5, 3).
NadarayaWatsonRequest Nw() {
  NadarayaWatsonRequest r;
  r.x_train = V({10, 3});
  r.y_train = V({10, 2});
  r.x_query = V({5, 3});
  return r;
}

// Fit baseline: x_train (10,), y_train (10,).
FitBandwidthRequest Fit() {
  FitBandwidthRequest r;
  r.x_train = V({10});
  r.y_train = V({10});
  return r;
}

// Wraps a mutation of an operation's baseline into a runnable case. The
// lengths vector (possibly empty) is owned by the closure and viewed with
// `lens_shape` when that is non-empty.
template <typename Mutate>
std::function<absl::Status(Engine&)> OnSoftmax(
    Mutate mutate, std::vector<int32_t> lens = {}, Shape lens_shape = {}) {
  return [=](Engine& engine) {
    MaskedSoftmaxRequest r = Softmax();
    if (!lens_shape.empty()) r.valid_lens = LengthsView{lens.data(), lens_shape};
    mutate(r);
    return engine.MaskedSoftmax(r).status();
  };
}
template <typename Mutate>
std::function<absl::Status(Engine&)> OnMatmul(Mutate mutate) {
  return [=](Engine& engine) {
    BatchMatmulRequest r = Matmul();
    mutate(r);
    return engine.BatchMatmul(r).status();
  };
}
template <typename Mutate>
std::function<absl::Status(Engine&)> OnAttention(
    Mutate mutate, std::vector<int32_t> lens = {}, Shape lens_shape = {}) {
  return [=](Engine& engine) {
    AttentionRequest r = Attn();
    if (!lens_shape.empty()) r.valid_lens = LengthsView{lens.data(), lens_shape};
    mutate(r);
    return engine.ScaledDotProductAttention(r).status();
  };
}
template <typename Mutate>
std::function<absl::Status(Engine&)> OnAdditive(
    Mutate mutate, std::vector<int32_t> lens = {}, Shape lens_shape = {}) {
  return [=](Engine& engine) {
    AdditiveAttentionRequest r = Additive();
    if (!lens_shape.empty()) r.valid_lens = LengthsView{lens.data(), lens_shape};
    mutate(r);
    return engine.AdditiveAttention(r).status();
  };
}
template <typename Mutate>
std::function<absl::Status(Engine&)> OnNw(Mutate mutate) {
  return [=](Engine& engine) {
    NadarayaWatsonRequest r = Nw();
    mutate(r);
    return engine.NadarayaWatson(r).status();
  };
}
template <typename Mutate>
std::function<absl::Status(Engine&)> OnFit(Mutate mutate) {
  return [=](Engine& engine) {
    FitBandwidthRequest r = Fit();
    mutate(r);
    return engine.FitBandwidth(r).status();
  };
}

auto NoChange = [](auto&) {};

// --- The valid baselines must run, so each bad case fails for its defect. ---

TEST(ValidateBaselineTest, EveryBaselineIsAccepted) {
  for (Engine* engine :
       {GetEngines().optimized.get(), GetEngines().reference.get()}) {
    ASSERT_NE(engine, nullptr);
    EXPECT_TRUE(OnSoftmax(NoChange)(*engine).ok());
    EXPECT_TRUE(OnSoftmax(NoChange, {0, 4}, {2})(*engine).ok());
    EXPECT_TRUE(OnSoftmax(NoChange, {0, 1, 2, 3, 4, 4}, {2, 3})(*engine).ok());
    EXPECT_TRUE(OnMatmul(NoChange)(*engine).ok());
    EXPECT_TRUE(OnAttention(NoChange)(*engine).ok());
    EXPECT_TRUE(OnAttention(NoChange, {0, 5, 10}, {3})(*engine).ok());
    EXPECT_TRUE(OnAttention([](AttentionRequest& r) {
                  r.queries = V({3, 2, 5, 4});
                  r.keys = V({3, 2, 10, 4});
                  r.values = V({3, 2, 10, 6});
                  r.scale = 0.5f;
                  r.return_weights = true;
                })(*engine)
                    .ok());
    EXPECT_TRUE(OnAdditive(NoChange)(*engine).ok());
    EXPECT_TRUE(
        OnAdditive(NoChange, {0, 1, 2, 6, 5, 4}, {2, 3})(*engine).ok());
    EXPECT_TRUE(OnNw(NoChange)(*engine).ok());
    EXPECT_TRUE(OnNw([](NadarayaWatsonRequest& r) {
                  r.x_train = V({10});
                  r.y_train = V({10});
                  r.x_query = V({5});
                  r.bandwidth = 2.5f;
                })(*engine)
                    .ok());
    EXPECT_TRUE(OnFit(NoChange)(*engine).ok());
  }
}

// --- The bad cases. ---

std::vector<BadCase> MaskedSoftmaxCases() {
  using R = MaskedSoftmaxRequest;
  return {
      {"x_rank2", OnSoftmax([](R& r) { r.x = V({3, 10}); }), {"x", "(3, 10)"}},
      {"x_rank4", OnSoftmax([](R& r) { r.x = V({2, 3, 4, 5}); }),
       {"x", "(2, 3, 4, 5)"}},
      {"x_rank0", OnSoftmax([](R& r) { r.x = V({}); }), {"x", "()"}},
      {"x_zero_dim", OnSoftmax([](R& r) { r.x = V({2, 0, 4}); }),
       {"x", "(2, 0, 4)"}},
      {"x_negative_dim", OnSoftmax([](R& r) { r.x = V({2, -1, 4}); }),
       {"x", "(2, -1, 4)"}},
      {"x_overflow", OnSoftmax([](R& r) { r.x = V({kHuge, kHuge, 1}); }),
       {"x", "(1099511627776, 1099511627776, 1)"}},
      {"x_just_over_limit",
       OnSoftmax([](R& r) { r.x = V({int64_t{1} << 16, int64_t{1} << 15, 1}); }),
       {"x", "(65536, 32768, 1)"}},
      {"x_null_data", OnSoftmax([](R& r) { r.x = Null({2, 3, 4}); }),
       {"x", "(2, 3, 4)"}},
      {"lens_batch_mismatch", OnSoftmax(NoChange, {1, 1, 1}, {3}),
       {"valid_lens", "(3)"}},
      {"lens_rows_mismatch", OnSoftmax(NoChange, std::vector<int32_t>(8, 1), {2, 4}),
       {"valid_lens", "(2, 4)"}},
      {"lens_rank3", OnSoftmax(NoChange, std::vector<int32_t>(6, 1), {2, 3, 1}),
       {"valid_lens", "(2, 3, 1)"}},
      {"lens_negative_per_batch", OnSoftmax(NoChange, {2, -1}, {2}),
       {"valid_lens", "-1"}},
      {"lens_negative_per_row", OnSoftmax(NoChange, {1, 2, 3, 4, 0, -7}, {2, 3}),
       {"valid_lens", "-7"}},
      {"lens_over_columns", OnSoftmax(NoChange, {4, 5}, {2}),
       {"valid_lens", "5"}},
      {"lens_over_columns_per_row",
       OnSoftmax(NoChange, {1, 2, 3, 4, 0, 1000}, {2, 3}),
       {"valid_lens", "1000"}},
      {"lens_null_data", OnSoftmax([](R& r) { r.valid_lens.data = nullptr; },
                                   {1, 1}, {2}),
       {"valid_lens"}},
  };
}

std::vector<BadCase> BatchMatmulCases() {
  using R = BatchMatmulRequest;
  return {
      {"a_rank2", OnMatmul([](R& r) { r.a = V({3, 10}); }), {"a", "(3, 10)"}},
      {"b_rank2", OnMatmul([](R& r) { r.b = V({4, 5}); }), {"b", "(4, 5)"}},
      {"b_rank4", OnMatmul([](R& r) { r.b = V({2, 4, 5, 1}); }),
       {"b", "(2, 4, 5, 1)"}},
      {"b_batch_mismatch", OnMatmul([](R& r) { r.b = V({3, 4, 5}); }),
       {"b", "(3, 4, 5)"}},
      {"b_inner_mismatch", OnMatmul([](R& r) { r.b = V({2, 5, 6}); }),
       {"b", "(2, 5, 6)"}},
      {"a_zero_dim", OnMatmul([](R& r) { r.a = V({2, 0, 4}); }),
       {"a", "(2, 0, 4)"}},
      {"b_zero_dim", OnMatmul([](R& r) { r.b = V({2, 4, 0}); }),
       {"b", "(2, 4, 0)"}},
      {"a_negative_dim", OnMatmul([](R& r) { r.a = V({-2, 3, 4}); }),
       {"a", "(-2, 3, 4)"}},
      {"a_null_data", OnMatmul([](R& r) { r.a = Null({2, 3, 4}); }),
       {"a", "(2, 3, 4)"}},
      {"b_null_data", OnMatmul([](R& r) { r.b = Null({2, 4, 5}); }),
       {"b", "(2, 4, 5)"}},
      {"a_overflow", OnMatmul([](R& r) { r.a = V({kHuge, kHuge, 4}); }),
       {"a", "(1099511627776, 1099511627776, 4)"}},
      {"b_overflow", OnMatmul([](R& r) { r.b = V({2, 4, kHuge}); }),
       {"b", "(2, 4, 1099511627776)"}},
      {"output_overflow",
       OnMatmul([](R& r) {
         r.a = V({1, kWide, 1});
         r.b = V({1, 1, kWide});
       }),
       {"output", "(1, 65536, 65536)"}},
  };
}

std::vector<BadCase> AttentionCases() {
  using R = AttentionRequest;
  return {
      {"queries_rank2", OnAttention([](R& r) { r.queries = V({3, 10}); }),
       {"queries", "(3, 10)"}},
      {"queries_rank5", OnAttention([](R& r) { r.queries = V({3, 1, 1, 5, 4}); }),
       {"queries", "(3, 1, 1, 5, 4)"}},
      {"keys_depth_mismatch", OnAttention([](R& r) { r.keys = V({3, 10, 2}); }),
       {"keys", "(3, 10, 2)"}},
      {"keys_rank_mismatch", OnAttention([](R& r) { r.keys = V({3, 1, 10, 4}); }),
       {"keys", "(3, 1, 10, 4)"}},
      {"keys_batch_mismatch", OnAttention([](R& r) { r.keys = V({2, 10, 4}); }),
       {"keys", "(2, 10, 4)"}},
      {"keys_heads_mismatch",
       OnAttention([](R& r) {
         r.queries = V({3, 2, 5, 4});
         r.keys = V({3, 3, 10, 4});
         r.values = V({3, 3, 10, 6});
       }),
       {"keys", "(3, 3, 10, 4)"}},
      {"values_length_mismatch",
       OnAttention([](R& r) { r.values = V({3, 9, 6}); }),
       {"values", "(3, 9, 6)"}},
      {"values_batch_mismatch",
       OnAttention([](R& r) { r.values = V({2, 10, 6}); }),
       {"values", "(2, 10, 6)"}},
      {"values_heads_mismatch",
       OnAttention([](R& r) {
         r.queries = V({3, 2, 5, 4});
         r.keys = V({3, 2, 10, 4});
         r.values = V({3, 1, 10, 6});
       }),
       {"values", "(3, 1, 10, 6)"}},
      {"queries_zero_dim", OnAttention([](R& r) { r.queries = V({3, 0, 4}); }),
       {"queries", "(3, 0, 4)"}},
      {"keys_zero_length", OnAttention([](R& r) { r.keys = V({3, 0, 4}); }),
       {"keys", "(3, 0, 4)"}},
      {"values_zero_depth", OnAttention([](R& r) { r.values = V({3, 10, 0}); }),
       {"values", "(3, 10, 0)"}},
      {"queries_null", OnAttention([](R& r) { r.queries = Null({3, 5, 4}); }),
       {"queries", "(3, 5, 4)"}},
      {"keys_null", OnAttention([](R& r) { r.keys = Null({3, 10, 4}); }),
       {"keys", "(3, 10, 4)"}},
      {"values_null", OnAttention([](R& r) { r.values = Null({3, 10, 6}); }),
       {"values", "(3, 10, 6)"}},
      {"queries_overflow",
       OnAttention([](R& r) { r.queries = V({kHuge, kHuge, 4}); }),
       {"queries", "(1099511627776, 1099511627776, 4)"}},
      {"keys_overflow", OnAttention([](R& r) { r.keys = V({3, kHuge * 4, 4}); }),
       {"keys", "(3, 4398046511104, 4)"}},
      {"weights_overflow",
       OnAttention([](R& r) {
         r.queries = V({1, kWide, 1});
         r.keys = V({1, kWide, 1});
         r.values = V({1, kWide, 1});
         r.return_weights = true;
       }),
       {"weights", "(1, 65536, 65536)"}},
      {"lens_batch_mismatch", OnAttention(NoChange, {1, 1, 1, 1}, {4}),
       {"valid_lens", "(4)"}},
      {"lens_rows_mismatch",
       OnAttention(NoChange, std::vector<int32_t>(18, 1), {3, 6}),
       {"valid_lens", "(3, 6)"}},
      {"lens_negative", OnAttention(NoChange, {1, -2, 3}, {3}),
       {"valid_lens", "-2"}},
      {"lens_over_keys", OnAttention(NoChange, {1, 11, 3}, {3}),
       {"valid_lens", "11"}},
      {"lens_null_data",
       OnAttention([](R& r) { r.valid_lens.data = nullptr; }, {1, 1, 1}, {3}),
       {"valid_lens"}},
      {"scale_nan", OnAttention([](R& r) { r.scale = kNaN; }), {"scale"}},
      {"scale_inf", OnAttention([](R& r) { r.scale = kInf; }), {"scale"}},
      {"scale_zero", OnAttention([](R& r) { r.scale = 0.0f; }), {"scale"}},
      {"scale_negative", OnAttention([](R& r) { r.scale = -1.0f; }), {"scale"}},
      {"scale_nan_gaussian",
       OnAttention([](R& r) {
         r.score = ScoreKind::kGaussian;
         r.scale = kNaN;
       }),
       {"scale"}},
  };
}

std::vector<BadCase> AdditiveAttentionCases() {
  using R = AdditiveAttentionRequest;
  return {
      {"queries_rank2", OnAdditive([](R& r) { r.queries = V({3, 10}); }),
       {"queries", "(3, 10)"}},
      {"queries_rank4", OnAdditive([](R& r) { r.queries = V({2, 1, 3, 4}); }),
       {"queries", "(2, 1, 3, 4)"}},
      {"keys_rank2", OnAdditive([](R& r) { r.keys = V({6, 5}); }),
       {"keys", "(6, 5)"}},
      {"keys_batch_mismatch", OnAdditive([](R& r) { r.keys = V({3, 6, 5}); }),
       {"keys", "(3, 6, 5)"}},
      {"values_length_mismatch",
       OnAdditive([](R& r) { r.values = V({2, 5, 7}); }),
       {"values", "(2, 5, 7)"}},
      {"values_batch_mismatch",
       OnAdditive([](R& r) { r.values = V({1, 6, 7}); }),
       {"values", "(1, 6, 7)"}},
      {"w_q_depth_mismatch", OnAdditive([](R& r) { r.w_q = V({8, 5}); }),
       {"w_q", "(8, 5)"}},
      {"w_q_rank1", OnAdditive([](R& r) { r.w_q = V({8}); }), {"w_q", "(8)"}},
      {"w_k_hidden_mismatch", OnAdditive([](R& r) { r.w_k = V({9, 5}); }),
       {"w_k", "(9, 5)"}},
      {"w_k_depth_mismatch", OnAdditive([](R& r) { r.w_k = V({8, 4}); }),
       {"w_k", "(8, 4)"}},
      {"w_v_hidden_mismatch", OnAdditive([](R& r) { r.w_v = V({9}); }),
       {"w_v", "(9)"}},
      {"w_v_rank2", OnAdditive([](R& r) { r.w_v = V({8, 1}); }),
       {"w_v", "(8, 1)"}},
      {"w_q_zero_hidden", OnAdditive([](R& r) { r.w_q = V({0, 4}); }),
       {"w_q", "(0, 4)"}},
      {"keys_zero_length", OnAdditive([](R& r) { r.keys = V({2, 0, 5}); }),
       {"keys", "(2, 0, 5)"}},
      {"values_zero_depth", OnAdditive([](R& r) { r.values = V({2, 6, 0}); }),
       {"values", "(2, 6, 0)"}},
      {"queries_null", OnAdditive([](R& r) { r.queries = Null({2, 3, 4}); }),
       {"queries", "(2, 3, 4)"}},
      {"keys_null", OnAdditive([](R& r) { r.keys = Null({2, 6, 5}); }),
       {"keys", "(2, 6, 5)"}},
      {"values_null", OnAdditive([](R& r) { r.values = Null({2, 6, 7}); }),
       {"values", "(2, 6, 7)"}},
      {"w_q_null", OnAdditive([](R& r) { r.w_q = Null({8, 4}); }),
       {"w_q", "(8, 4)"}},
      {"w_k_null", OnAdditive([](R& r) { r.w_k = Null({8, 5}); }),
       {"w_k", "(8, 5)"}},
      {"w_v_null", OnAdditive([](R& r) { r.w_v = Null({8}); }),
       {"w_v", "(8)"}},
      {"w_q_overflow", OnAdditive([](R& r) { r.w_q = V({kHuge, kHuge}); }),
       {"w_q", "(1099511627776, 1099511627776)"}},
      {"weights_overflow",
       OnAdditive([](R& r) {
         r.queries = V({1, kWide, 1});
         r.keys = V({1, kWide, 1});
         r.values = V({1, kWide, 1});
         r.w_q = V({1, 1});
         r.w_k = V({1, 1});
         r.w_v = V({1});
         r.return_weights = true;
       }),
       {"weights", "(1, 65536, 65536)"}},
      {"lens_batch_mismatch", OnAdditive(NoChange, {1, 1, 1}, {3}),
       {"valid_lens", "(3)"}},
      {"lens_rows_mismatch", OnAdditive(NoChange, std::vector<int32_t>(4, 1), {2, 2}),
       {"valid_lens", "(2, 2)"}},
      {"lens_negative", OnAdditive(NoChange, {-1, 3}, {2}),
       {"valid_lens", "-1"}},
      {"lens_over_keys", OnAdditive(NoChange, {1, 2, 3, 4, 5, 7}, {2, 3}),
       {"valid_lens", "7"}},
      {"lens_null_data",
       OnAdditive([](R& r) { r.valid_lens.data = nullptr; }, {1, 1}, {2}),
       {"valid_lens"}},
  };
}

std::vector<BadCase> NadarayaWatsonCases() {
  using R = NadarayaWatsonRequest;
  return {
      {"x_train_rank3", OnNw([](R& r) { r.x_train = V({10, 3, 1}); }),
       {"x_train", "(10, 3, 1)"}},
      {"x_train_rank0", OnNw([](R& r) { r.x_train = V({}); }),
       {"x_train", "()"}},
      {"y_train_rank3", OnNw([](R& r) { r.y_train = V({10, 2, 1}); }),
       {"y_train", "(10, 2, 1)"}},
      {"y_train_length_mismatch", OnNw([](R& r) { r.y_train = V({9, 2}); }),
       {"y_train", "(9, 2)"}},
      {"y_train_length_mismatch_1d",
       OnNw([](R& r) {
         r.x_train = V({10});
         r.y_train = V({11});
         r.x_query = V({5});
       }),
       {"y_train", "(11)"}},
      {"x_query_dx_mismatch", OnNw([](R& r) { r.x_query = V({5, 2}); }),
       {"x_query", "(5, 2)"}},
      {"x_query_rank_below_train", OnNw([](R& r) { r.x_query = V({5}); }),
       {"x_query", "(5)"}},
      {"x_query_rank_above_train",
       OnNw([](R& r) {
         r.x_train = V({10});
         r.y_train = V({10});
         r.x_query = V({5, 1});
       }),
       {"x_query", "(5, 1)"}},
      {"x_train_zero", OnNw([](R& r) { r.x_train = V({0, 3}); }),
       {"x_train", "(0, 3)"}},
      {"y_train_zero_dy", OnNw([](R& r) { r.y_train = V({10, 0}); }),
       {"y_train", "(10, 0)"}},
      {"x_query_zero", OnNw([](R& r) { r.x_query = V({0, 3}); }),
       {"x_query", "(0, 3)"}},
      {"x_train_null", OnNw([](R& r) { r.x_train = Null({10, 3}); }),
       {"x_train", "(10, 3)"}},
      {"y_train_null", OnNw([](R& r) { r.y_train = Null({10, 2}); }),
       {"y_train", "(10, 2)"}},
      {"x_query_null", OnNw([](R& r) { r.x_query = Null({5, 3}); }),
       {"x_query", "(5, 3)"}},
      {"x_query_overflow", OnNw([](R& r) { r.x_query = V({kHuge, 3}); }),
       {"x_query", "(1099511627776, 3)"}},
      {"output_overflow",
       OnNw([](R& r) {
         r.x_train = V({1});
         r.y_train = V({1, kWide});
         r.x_query = V({kWide});
       }),
       {"output", "(65536, 65536)"}},
      {"weights_overflow",
       OnNw([](R& r) {
         r.x_train = V({kWide});
         r.y_train = V({kWide});
         r.x_query = V({kWide});
         r.return_weights = true;
       }),
       {"weights", "(65536, 65536)"}},
      {"bandwidth_zero", OnNw([](R& r) { r.bandwidth = 0.0f; }), {"bandwidth"}},
      {"bandwidth_negative", OnNw([](R& r) { r.bandwidth = -1.0f; }),
       {"bandwidth"}},
      {"bandwidth_nan", OnNw([](R& r) { r.bandwidth = kNaN; }), {"bandwidth"}},
      {"bandwidth_inf", OnNw([](R& r) { r.bandwidth = kInf; }), {"bandwidth"}},
      {"bandwidth_nan_boxcar",
       OnNw([](R& r) {
         r.kernel = RegressionKernel::kBoxcar;
         r.bandwidth = kNaN;
       }),
       {"bandwidth"}},
  };
}

std::vector<BadCase> FitBandwidthCases() {
  using R = FitBandwidthRequest;
  return {
      {"n_train_1",
       OnFit([](R& r) {
         r.x_train = V({1});
         r.y_train = V({1});
       }),
       {"x_train", "(1)"}},
      {"n_train_1_2d",
       OnFit([](R& r) {
         r.x_train = V({1, 2});
         r.y_train = V({1, 2});
       }),
       {"x_train", "(1, 2)"}},
      {"x_train_rank3", OnFit([](R& r) { r.x_train = V({10, 1, 1}); }),
       {"x_train", "(10, 1, 1)"}},
      {"y_train_length_mismatch", OnFit([](R& r) { r.y_train = V({9}); }),
       {"y_train", "(9)"}},
      {"x_train_zero", OnFit([](R& r) { r.x_train = V({0}); }),
       {"x_train", "(0)"}},
      {"x_train_null", OnFit([](R& r) { r.x_train = Null({10}); }),
       {"x_train", "(10)"}},
      {"y_train_null", OnFit([](R& r) { r.y_train = Null({10}); }),
       {"y_train", "(10)"}},
      {"epochs_zero", OnFit([](R& r) { r.epochs = 0; }), {"epochs"}},
      {"epochs_negative", OnFit([](R& r) { r.epochs = -3; }), {"epochs"}},
      {"epochs_too_many", OnFit([](R& r) { r.epochs = 100001; }), {"epochs"}},
      {"learning_rate_zero", OnFit([](R& r) { r.learning_rate = 0.0f; }),
       {"learning_rate"}},
      {"learning_rate_negative", OnFit([](R& r) { r.learning_rate = -0.5f; }),
       {"learning_rate"}},
      {"learning_rate_nan", OnFit([](R& r) { r.learning_rate = kNaN; }),
       {"learning_rate"}},
      {"learning_rate_inf", OnFit([](R& r) { r.learning_rate = kInf; }),
       {"learning_rate"}},
      {"initial_bandwidth_zero",
       OnFit([](R& r) { r.initial_bandwidth = 0.0f; }), {"initial_bandwidth"}},
      {"initial_bandwidth_negative",
       OnFit([](R& r) { r.initial_bandwidth = -1.0f; }), {"initial_bandwidth"}},
      {"initial_bandwidth_nan",
       OnFit([](R& r) { r.initial_bandwidth = kNaN; }), {"initial_bandwidth"}},
  };
}

class BadRequestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, IsInvalidArgumentNamingTheArgument) {
  const BadCase& c = GetParam();
  for (Engine* engine :
       {GetEngines().optimized.get(), GetEngines().reference.get()}) {
    ASSERT_NE(engine, nullptr);
    const absl::Status status = c.run(*engine);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (const std::string& expected : c.expect) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(expected));
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<BadCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(MaskedSoftmax, BadRequestTest,
                         ::testing::ValuesIn(MaskedSoftmaxCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(BatchMatmul, BadRequestTest,
                         ::testing::ValuesIn(BatchMatmulCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(Attention, BadRequestTest,
                         ::testing::ValuesIn(AttentionCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(AdditiveAttention, BadRequestTest,
                         ::testing::ValuesIn(AdditiveAttentionCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(NadarayaWatson, BadRequestTest,
                         ::testing::ValuesIn(NadarayaWatsonCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(FitBandwidth, BadRequestTest,
                         ::testing::ValuesIn(FitBandwidthCases()), CaseName);

// The Validate functions themselves: an accepted request's plan carries the
// documented dimensions and shapes (output pointers left null).
TEST(ValidatePlanTest, AttentionPlanHasDocumentedShapes) {
  AttentionRequest r = Attn();
  r.return_weights = true;
  const std::vector<int32_t> lens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3};
  r.valid_lens = LengthsView{lens.data(), {3, 5}};
  absl::StatusOr<Plan<AttentionParams>> plan = ValidateAttention(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->output_shape, (Shape{3, 5, 6}));
  EXPECT_EQ(plan->weights_shape, (Shape{3, 5, 10}));
  EXPECT_EQ(plan->params.out, nullptr);
  EXPECT_EQ(plan->params.weights, nullptr);
  EXPECT_EQ(plan->params.valid.kind, ValidLengths::Kind::kPerRow);
  EXPECT_EQ(plan->params.valid.Limit(1, 2, 10), 7);
  // Default dot-product scale is 1/sqrt(d) with d = 4.
  EXPECT_FLOAT_EQ(plan->params.scale, 0.5f);
}

TEST(ValidatePlanTest, NadarayaWatsonOutputRankFollowsYTrain) {
  NadarayaWatsonRequest r = Nw();
  absl::StatusOr<Plan<NadarayaWatsonParams>> plan = ValidateNadarayaWatson(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->output_shape, (Shape{5, 2}));
  EXPECT_TRUE(plan->weights_shape.empty());
  EXPECT_EQ(plan->params.dx, 3);
  EXPECT_EQ(plan->params.dy, 2);

  r.x_train = V({10});
  r.y_train = V({10});
  r.x_query = V({5});
  r.return_weights = true;
  plan = ValidateNadarayaWatson(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->output_shape, (Shape{5}));
  EXPECT_EQ(plan->weights_shape, (Shape{5, 10}));
  EXPECT_EQ(plan->params.dx, 1);
  EXPECT_EQ(plan->params.dy, 1);
}

// SizeOfResult: shapes and element counts before any allocation, for a
// server to refuse results it could not send (fuzz/typed_request found a
// 370 KB BatchMatmul whose 8.5 GB product was allocated first).
TEST(SizeOfResultTest, CountsOutputAndWeights) {
  BatchMatmulRequest matmul;
  matmul.a = V({1, 46000, 1});
  matmul.b = V({1, 1, 46000});
  absl::StatusOr<ResultSize> size = SizeOfResult(matmul);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->output_shape, (Shape{1, 46000, 46000}));
  EXPECT_TRUE(size->weights_shape.empty());
  EXPECT_EQ(size->elements, int64_t{46000} * 46000);

  AttentionRequest attention;
  attention.queries = V({2, 3, 4});
  attention.keys = V({2, 5, 4});
  attention.values = V({2, 5, 7});
  size = SizeOfResult(attention);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->elements, 2 * 3 * 7);
  attention.return_weights = true;
  size = SizeOfResult(attention);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->weights_shape, (Shape{2, 3, 5}));
  EXPECT_EQ(size->elements, 2 * 3 * 7 + 2 * 3 * 5);
}

TEST(SizeOfResultTest, InvalidRequestGivesItsValidationError) {
  BatchMatmulRequest matmul;
  matmul.a = V({1, 3, 2});
  matmul.b = V({1, 4, 5});
  absl::StatusOr<ResultSize> size = SizeOfResult(matmul);
  EXPECT_EQ(size.status(), ValidateBatchMatmul(matmul).status());
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attn
