// The batching rules of every operation: ragged requests of one class run
// together, and each result stays within the derived error bound of the
// double-precision reference for the request alone, with exact zeros where
// the reference has them (masked positions); requests that must not share
// a batch get different class keys.
#include "server/execution/batchable.h"

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "attn/engine.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "attn/work.h"
#include "gtest/gtest.h"
#include "server/execution/call_runner.h"

namespace attnserve {
namespace {

using ::attn::testing::AllExactly;
using ::attn::testing::RandomNormal;
using ::attn::testing::WithinBounds;

attn::testing::ErrorBounds BoundsFor(const attn::AttentionRequest& r,
                                     const attn::OpResult& exact) {
  return attn::testing::AttentionBounds(r, exact);
}
attn::testing::ErrorBounds BoundsFor(const attn::MaskedSoftmaxRequest& r,
                                     const attn::OpResult& exact) {
  return attn::testing::MaskedSoftmaxBounds(r, exact);
}
attn::testing::ErrorBounds BoundsFor(const attn::BatchMatmulRequest& r,
                                     const attn::OpResult& exact) {
  return attn::testing::BatchMatmulBounds(r, exact);
}
attn::testing::ErrorBounds BoundsFor(const attn::AdditiveAttentionRequest& r,
                                     const attn::OpResult& exact) {
  return attn::testing::AdditiveAttentionBounds(r, exact);
}
attn::testing::ErrorBounds BoundsFor(const attn::NadarayaWatsonRequest& r,
                                     const attn::OpResult& exact) {
  return attn::testing::NadarayaWatsonBounds(r, exact);
}

// Every element exactly zero in `exact` is exactly zero in `actual`.
::testing::AssertionResult ZerosKept(const attn::Tensor& actual,
                                     const attn::Tensor& exact) {
  for (size_t i = 0; i < exact.data.size(); ++i) {
    if (exact.data[i] == 0.0f) {
      ::testing::AssertionResult zero =
          AllExactly(actual, 0.0f, static_cast<int64_t>(i),
                     static_cast<int64_t>(i) + 1);
      if (!zero) return zero;
    }
  }
  return ::testing::AssertionSuccess();
}

class BatchableTest : public ::testing::Test {
 protected:
  BatchableTest()
      : engine_(attn::Engine::Create(attn::EngineOptions{}).value()) {}

  // Owned inputs: views into them stay valid for the test.
  attn::TensorView Normal(attn::Shape shape, float stddev = 1.0f) {
    tensors_.push_back(RandomNormal(rng_, std::move(shape), stddev));
    return tensors_.back().view();
  }
  attn::LengthsView Lengths(attn::Shape shape, int32_t high) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    lengths_.push_back(attn::testing::RandomLengths(rng_, count, 0, high));
    return attn::testing::ViewOf(lengths_.back(), std::move(shape));
  }
  // None, (B,) or (B, rows) lengths, by `form` (0, 1, 2).
  attn::LengthsView SomeLengths(int form, int64_t batch, int64_t rows,
                                int64_t columns) {
    if (form == 1) return Lengths({batch}, static_cast<int32_t>(columns));
    if (form == 2) return Lengths({batch, rows}, static_cast<int32_t>(columns));
    return {};
  }
  int64_t Uniform(int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng_);
  }

  // All of `requests` share a class; run together, each result is within
  // the bound of its reference alone and keeps its exact zeros. Returns the
  // work the combined run reported.
  template <typename Request>
  CombinedWork ExpectEachAsAlone(const std::vector<Request>& requests) {
    std::vector<OperationRequest> batchable(requests.begin(), requests.end());
    std::vector<const OperationRequest*> pointers;
    const std::string key = ClassifyForBatching(batchable.front())->key;
    for (const OperationRequest& request : batchable) {
      absl::StatusOr<BatchClass> batch_class = ClassifyForBatching(request);
      EXPECT_TRUE(batch_class.ok()) << batch_class.status();
      if (batch_class.ok()) {
        EXPECT_EQ(batch_class->key, key);
      }
      pointers.push_back(&request);
    }
    CombinedWork work;
    std::vector<absl::StatusOr<attn::OpResult>> results =
        RunTogether(*engine_, pointers, &work);
    EXPECT_EQ(results.size(), requests.size());
    for (size_t i = 0; i < results.size() && i < requests.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "request " << i);
      EXPECT_TRUE(results[i].ok()) << results[i].status();
      if (!results[i].ok()) continue;
      const attn::OpResult exact =
          RunAlone(attn::testing::ReferenceEngine(), batchable[i]).value();
      const attn::testing::ErrorBounds bounds = BoundsFor(requests[i], exact);
      EXPECT_TRUE(WithinBounds(results[i]->output, exact.output, bounds.output));
      EXPECT_TRUE(ZerosKept(results[i]->output, exact.output));
      EXPECT_EQ(results[i]->weights.empty(), exact.weights.empty());
      if (!exact.weights.empty()) {
        EXPECT_TRUE(
            WithinBounds(results[i]->weights, exact.weights, bounds.weights));
        EXPECT_TRUE(ZerosKept(results[i]->weights, exact.weights));
      }
    }
    return work;
  }

  std::mt19937 rng_{11};
  std::unique_ptr<attn::Engine> engine_;
  std::deque<attn::Tensor> tensors_;
  std::deque<std::vector<int32_t>> lengths_;
};

TEST_F(BatchableTest, MaskedSoftmaxPadsRowsAndColumns) {
  std::vector<attn::MaskedSoftmaxRequest> requests;
  for (int i = 0; i < 6; ++i) {
    const int64_t batch = Uniform(1, 3), rows = Uniform(1, 17),
                  columns = Uniform(1, 33);
    attn::MaskedSoftmaxRequest r;
    r.x = Normal({batch, rows, columns}, 3.0f);
    r.valid_lens = SomeLengths(i % 3, batch, rows, columns);
    requests.push_back(r);
  }
  const CombinedWork work = ExpectEachAsAlone(requests);
  EXPECT_GT(work.computed_elements, work.useful_elements);
}

TEST_F(BatchableTest, EqualShapesWithoutLengthsNeedNoMask) {
  // No padding and no lengths: the combined call runs unmasked.
  std::vector<attn::MaskedSoftmaxRequest> softmax;
  std::vector<attn::AttentionRequest> attention;
  for (int i = 0; i < 4; ++i) {
    softmax.push_back(attn::MaskedSoftmaxRequest{Normal({2, 5, 9}, 3.0f), {}});
    attn::AttentionRequest r;
    r.queries = Normal({1, 2, 6, 8});
    r.keys = Normal({1, 2, 7, 8});
    r.values = Normal({1, 2, 7, 3});
    r.causal = i == 0 ? false : true;
    r.return_weights = true;
    if (i > 0) attention.push_back(r);  // one class: all causal
  }
  CombinedWork work = ExpectEachAsAlone(softmax);
  EXPECT_EQ(work.computed_elements, work.useful_elements);
  work = ExpectEachAsAlone(attention);
  EXPECT_EQ(work.computed_elements, work.useful_elements);
}

class BatchMatmulBatchingTest
    : public BatchableTest,
      public ::testing::WithParamInterface<attn::Precision> {};

TEST_P(BatchMatmulBatchingTest, PadsRowsOfA) {
  std::vector<attn::BatchMatmulRequest> requests;
  for (int i = 0; i < 5; ++i) {
    const int64_t n = Uniform(1, 3), m = Uniform(1, 20);
    requests.push_back(
        attn::BatchMatmulRequest{Normal({n, m, 7}), Normal({n, 7, 5}), GetParam()});
  }
  const CombinedWork work = ExpectEachAsAlone(requests);
  EXPECT_GT(work.computed_elements, work.useful_elements);
}

INSTANTIATE_TEST_SUITE_P(Precisions, BatchMatmulBatchingTest,
                         ::testing::Values(attn::Precision::kFloat32,
                                           attn::Precision::kBFloat16));

TEST_F(BatchableTest, AdditiveAttentionSharesTheModelsWeights) {
  const int64_t dq = 6, dk = 9, h = 8, dv = 3;
  const attn::TensorView w_q = Normal({h, dq}, 0.5f), w_k = Normal({h, dk}, 0.5f),
                         w_v = Normal({h});
  std::vector<attn::AdditiveAttentionRequest> requests;
  for (int i = 0; i < 6; ++i) {
    const int64_t batch = Uniform(1, 3), lq = Uniform(1, 12), lk = Uniform(1, 20);
    attn::AdditiveAttentionRequest r;
    r.queries = Normal({batch, lq, dq});
    r.keys = Normal({batch, lk, dk});
    r.values = Normal({batch, lk, dv});
    r.w_q = w_q;
    r.w_k = w_k;
    r.w_v = w_v;
    r.valid_lens = SomeLengths(i % 3, batch, lq, lk);
    r.return_weights = true;
    requests.push_back(r);
  }
  const CombinedWork work = ExpectEachAsAlone(requests);
  EXPECT_GT(work.computed_elements, work.useful_elements);
}

TEST_F(BatchableTest, NadarayaWatsonConcatenatesQueriesOfOneTrainingSet) {
  for (int64_t dims : {0, 2}) {  // 0: the 1-D layout of the textbook
    SCOPED_TRACE(::testing::Message() << "dims " << dims);
    const int64_t n = 50;
    auto shape = [dims](int64_t rows) {
      return dims == 0 ? attn::Shape{rows} : attn::Shape{rows, dims};
    };
    const attn::TensorView x_train = Normal(shape(n)), y_train = Normal(shape(n));
    std::vector<attn::NadarayaWatsonRequest> requests;
    for (int i = 0; i < 4; ++i) {
      attn::NadarayaWatsonRequest r;
      r.x_train = x_train;
      r.y_train = y_train;
      r.x_query = Normal(shape(Uniform(1, 30)));
      r.bandwidth = 1.5f;
      r.return_weights = true;
      requests.push_back(r);
    }
    const CombinedWork work = ExpectEachAsAlone(requests);
    EXPECT_EQ(work.computed_elements, work.useful_elements);  // no padding
  }
}

// Issue #47: calls on successive versions of a memory that grew by appends
// (one lineage: each version's rows a prefix of the next) share a class
// and one pass over the newest version; each answer is its own version's,
// within its bound, weights of its own width; versions of no lineage stay
// apart.
TEST_F(BatchableTest, StoredAttentionOverOneLineageMasksEachCallToItsRows) {
  const int64_t n = 40, d = 8, dv = 5;
  const attn::Tensor keys = RandomNormal(rng_, {1, n, d});
  const attn::Tensor values = RandomNormal(rng_, {1, n, dv});
  const int lineage = 0;
  const int64_t version_rows[] = {25, 40, 33, 40};
  for (bool weights : {false, true}) {
    SCOPED_TRACE(weights);
    std::vector<OperationRequest> requests;
    std::vector<const OperationRequest*> pointers;
    for (int i = 0; i < 4; ++i) {
      const int64_t rows = version_rows[i];
      attn::AttentionRequest attention;
      attention.queries = Normal({1, 3, d});
      attention.keys = attn::TensorView{keys.data.data(), {1, rows, d}};
      attention.values = attn::TensorView{values.data.data(), {1, rows, dv}};
      attention.return_weights = weights;
      // Each version its own identity, all of one lineage.
      requests.push_back(StoredRequest{attention, &version_rows[i], &lineage,
                                       {1, 3, dv}, {1, 3, rows}});
      EXPECT_EQ(ClassifyForBatching(requests.back())->key,
                ClassifyForBatching(requests.front())->key);
      StoredRequest alone = std::get<StoredRequest>(requests.back());
      alone.lineage = nullptr;
      if (i > 0) {
        EXPECT_NE(ClassifyForBatching(alone)->key,
                  ClassifyForBatching(requests.front())->key);
      }
    }
    for (const OperationRequest& r : requests) pointers.push_back(&r);
    CombinedWork work;
    std::vector<absl::StatusOr<attn::OpResult>> results =
        RunTogether(*engine_, pointers, &work);
    EXPECT_EQ(work.combined_requests, 4);
    for (size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "version of " << version_rows[i]);
      ASSERT_TRUE(results[i].ok()) << results[i].status();
      attn::AttentionRequest plain = std::get<attn::AttentionRequest>(
          std::get<StoredRequest>(requests[i]).request);
      plain.return_weights = true;
      const attn::OpResult exact =
          attn::testing::ReferenceEngine().ScaledDotProductAttention(plain)
              .value();
      const attn::testing::ErrorBounds bounds =
          attn::testing::AttentionBounds(plain, exact);
      EXPECT_TRUE(WithinBounds(results[i]->output, exact.output, bounds.output));
      if (weights) {
        EXPECT_EQ(results[i]->weights.shape, (attn::Shape{1, 3, version_rows[i]}));
        EXPECT_TRUE(
            WithinBounds(results[i]->weights, exact.weights, bounds.weights));
      }
    }
  }
}

// Issue #47: a grown memory held in pieces (its base's rows, then those
// appended since; StoredRequest::pieces). Calls on versions of one lineage,
// held in one piece, two or three, share a class and one pass per piece of
// the newest, each call's rows masked to the keys of its own version that
// piece holds, the pieces merged by log-sum-exp. Each answer, stacked or
// alone, is within its merge's bound of the reference over its version's
// rows in one piece, weights over all of them in row order.
TEST_F(BatchableTest, StoredAttentionInPiecesMergesEachCallOverItsRows) {
  const int64_t n = 70, d = 8, dv = 5;
  const attn::Tensor keys = RandomNormal(rng_, {1, n, d});
  const attn::Tensor values = RandomNormal(rng_, {1, n, dv});
  const int lineage = 0;
  // Each version's pieces, by rows: one piece alone is held contiguous.
  const std::vector<std::vector<int64_t>> versions = {
      {30}, {30, 15}, {30, 40}, {30, 22}, {30, 20, 20}};
  for (attn::ScoreKind score :
       {attn::ScoreKind::kDotProduct, attn::ScoreKind::kGaussian}) {
    for (bool weights : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "gaussian " << (score == attn::ScoreKind::kGaussian)
                   << " weights " << weights);
      std::vector<OperationRequest> requests;
      std::vector<int64_t> version_rows;
      for (size_t i = 0; i < versions.size(); ++i) {
        attn::AttentionRequest attention;
        attention.queries = Normal({1, 3, d});
        attention.score = score;
        attention.return_weights = weights;
        StoredRequest stored{attention, &versions[i], &lineage, {1, 3, dv}, {}};
        int64_t first = 0;
        for (int64_t rows : versions[i]) {
          attn::AttentionRequest piece = attention;
          piece.keys = attn::TensorView{keys.data.data() + first * d,
                                        {1, rows, d}};
          piece.values = attn::TensorView{values.data.data() + first * dv,
                                          {1, rows, dv}};
          stored.pieces.push_back(piece);
          first += rows;
        }
        stored.request = stored.pieces.front();
        if (stored.pieces.size() == 1) stored.pieces.clear();
        stored.weights_shape = {1, 3, first};
        version_rows.push_back(first);
        requests.push_back(std::move(stored));
        EXPECT_EQ(ClassifyForBatching(requests.back())->key,
                  ClassifyForBatching(requests.front())->key);
      }
      std::vector<const OperationRequest*> pointers;
      for (const OperationRequest& r : requests) pointers.push_back(&r);
      CombinedWork work;
      std::vector<absl::StatusOr<attn::OpResult>> results =
          RunTogether(*engine_, pointers, &work);
      EXPECT_EQ(work.combined_requests, static_cast<int>(versions.size()));
      // One pass over each of the newest version's pieces (70 keys).
      EXPECT_EQ(work.computed_elements,
                3 * static_cast<int64_t>(versions.size()) * n);
      for (size_t i = 0; i < requests.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << "version of " << version_rows[i]);
        ASSERT_TRUE(results[i].ok()) << results[i].status();
        const StoredRequest& stored = std::get<StoredRequest>(requests[i]);
        attn::AttentionRequest whole =
            std::get<attn::AttentionRequest>(stored.request);
        whole.keys = attn::TensorView{keys.data.data(), {1, version_rows[i], d}};
        whole.values =
            attn::TensorView{values.data.data(), {1, version_rows[i], dv}};
        whole.return_weights = true;
        const attn::OpResult exact =
            attn::testing::ReferenceEngine().ScaledDotProductAttention(whole)
                .value();
        // The merge's bound: its pieces' log-sum-exp bounds.
        double piece_error = 0.0;
        for (const attn::AttentionRequest& piece : stored.pieces) {
          attn::AttentionRequest own = piece;
          own.return_weights = true;
          own.return_log_sum_exp = true;
          const attn::OpResult piece_exact =
              attn::testing::ReferenceEngine().ScaledDotProductAttention(own)
                  .value();
          for (float bound : attn::testing::AttentionBounds(own, piece_exact)
                                 .log_sum_exp.data) {
            piece_error = std::max<double>(piece_error, bound);
          }
        }
        const attn::testing::ErrorBounds bounds =
            attn::testing::AttentionBounds(whole, exact, piece_error);
        const attn::OpResult alone = RunAlone(*engine_, requests[i]).value();
        for (const attn::OpResult* answer :
             {static_cast<const attn::OpResult*>(&*results[i]), &alone}) {
          EXPECT_EQ(answer->output.shape, exact.output.shape);
          EXPECT_TRUE(
              WithinBounds(answer->output, exact.output, bounds.output));
          EXPECT_TRUE(answer->log_sum_exp.empty());
          EXPECT_EQ(answer->weights.empty(), !weights);
          if (weights) {
            EXPECT_EQ(answer->weights.shape,
                      (attn::Shape{1, 3, version_rows[i]}));
            EXPECT_TRUE(
                WithinBounds(answer->weights, exact.weights, bounds.weights));
          }
        }
      }
    }
  }
}

// A grown memory's first piece may be a few rows: its calls are worth
// every core (BatchClass::shares_a_pass) when any piece is long enough for
// the wide engine to share out, not only the first.
TEST_F(BatchableTest, AMemoryInPiecesSharesAPassWhenAnyPieceIsLong) {
  const int64_t d = 8, dv = 4, base = 1024, appended = 2 * attn::kMinKeysPerShare;
  const attn::Tensor keys = RandomNormal(rng_, {1, base + appended, d});
  const attn::Tensor values = RandomNormal(rng_, {1, base + appended, dv});
  attn::AttentionRequest attention;
  attention.queries = Normal({1, 1, d});
  StoredRequest stored{attention, &keys, &keys, {1, 1, dv}, {}};
  for (const auto& [first, rows] :
       {std::pair<int64_t, int64_t>{0, base}, {base, appended}}) {
    attn::AttentionRequest piece = attention;
    piece.keys = attn::TensorView{keys.data.data() + first * d, {1, rows, d}};
    piece.values =
        attn::TensorView{values.data.data() + first * dv, {1, rows, dv}};
    stored.pieces.push_back(piece);
  }
  stored.request = stored.pieces.front();
  EXPECT_TRUE(ClassifyForBatching(stored, engine_.get())->shares_a_pass);
  // The first piece alone is not long enough.
  StoredRequest first_only = stored;
  first_only.pieces.clear();
  EXPECT_FALSE(ClassifyForBatching(first_only, engine_.get())->shares_a_pass);
}

// Queries against one stored memory stack into one pass over it; each
// answer is, within its bound, the plain reference of the same queries
// against the memory repeated for every batch entry (keys [B, N, d]), so the
// reshapes in and out are checked too.
TEST_F(BatchableTest, StoredAttentionStacksQueriesOfOneMemory) {
  const int64_t n = 37, d = 8, dv = 5;
  const attn::Tensor keys = RandomNormal(rng_, {1, n, d});
  const attn::Tensor values = RandomNormal(rng_, {1, n, dv});
  for (attn::ScoreKind score :
       {attn::ScoreKind::kDotProduct, attn::ScoreKind::kGaussian}) {
    for (bool weights : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "gaussian " << (score ==
                   attn::ScoreKind::kGaussian) << " weights " << weights);
      std::vector<OperationRequest> requests;
      std::vector<const OperationRequest*> pointers;
      for (int i = 0; i < 4; ++i) {
        // As the memory's kind builds a call of queries [B, Lq, d]: one
        // batch entry of B * Lq rows, seen as [B, Lq, ...].
        const int64_t batch = Uniform(1, 3), queries = Uniform(1, 4);
        attn::AttentionRequest attention;
        attention.queries = Normal({1, batch * queries, d});
        attention.keys = keys.view();
        attention.values = values.view();
        attention.score = score;
        attention.return_weights = weights;
        requests.push_back(StoredRequest{attention, &keys, nullptr,
                                         {batch, queries, dv},
                                         {batch, queries, n}});
        EXPECT_EQ(ClassifyForBatching(requests.back())->key,
                  ClassifyForBatching(requests.front())->key);
      }
      for (const OperationRequest& r : requests) pointers.push_back(&r);
      CombinedWork work;
      std::vector<absl::StatusOr<attn::OpResult>> results =
          RunTogether(*engine_, pointers, &work);
      EXPECT_EQ(work.combined_requests, 4);
      ASSERT_EQ(results.size(), requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << "request " << i);
        ASSERT_TRUE(results[i].ok()) << results[i].status();
        const auto& stored = std::get<StoredRequest>(requests[i]);
        const auto& attention =
            std::get<attn::AttentionRequest>(stored.request);
        const int64_t batch = stored.output_shape[0];
        const int64_t queries = stored.output_shape[1];
        // The same queries as B batch entries, each with its own copy of
        // the memory.
        const attn::Tensor repeated_keys =
            attn::testing::RepeatAsBatch(keys, batch);
        const attn::Tensor repeated_values =
            attn::testing::RepeatAsBatch(values, batch);
        attn::AttentionRequest plain = attention;
        plain.queries.shape = {batch, queries, d};
        plain.keys = repeated_keys.view();
        plain.values = repeated_values.view();
        plain.return_weights = true;  // the bounds are derived from them
        const attn::OpResult exact =
            attn::testing::ReferenceEngine().ScaledDotProductAttention(plain)
                .value();
        const attn::testing::ErrorBounds bounds =
            attn::testing::AttentionBounds(plain, exact);
        EXPECT_EQ(results[i]->output.shape, exact.output.shape);
        EXPECT_TRUE(
            WithinBounds(results[i]->output, exact.output, bounds.output));
        EXPECT_EQ(results[i]->weights.empty(), !weights);
        if (weights) {
          EXPECT_EQ(results[i]->weights.shape, exact.weights.shape);
          EXPECT_TRUE(
              WithinBounds(results[i]->weights, exact.weights, bounds.weights));
        }
        // Alone, the same shapes.
        const attn::OpResult alone = RunAlone(*engine_, requests[i]).value();
        EXPECT_EQ(alone.output.shape, exact.output.shape);
        EXPECT_TRUE(WithinBounds(alone.output, exact.output, bounds.output));
      }
    }
  }
  // Another memory, or another stored version of it, is another class.
  attn::AttentionRequest attention;
  attention.queries = Normal({1, 2, d});
  attention.keys = keys.view();
  attention.values = values.view();
  const StoredRequest other{attention, &values, nullptr, {1, 2, dv}, {1, 2, n}};
  StoredRequest same = other;
  same.version = &keys;
  EXPECT_NE(ClassifyForBatching(other)->key, ClassifyForBatching(same)->key);
}

// Queries on one stored training set join one class by the set's identity
// (never its contents, which are not read to classify) and are
// concatenated; each answer is within its bound of the plain reference.
TEST_F(BatchableTest, StoredRegressionConcatenatesQueriesOfOneTrainingSet) {
  const int64_t n = 29, dx = 2, dy = 3;
  const attn::Tensor x_train = RandomNormal(rng_, {n, dx});
  const attn::Tensor y_train = RandomNormal(rng_, {n, dy});
  std::vector<OperationRequest> requests;
  std::vector<const OperationRequest*> pointers;
  for (int i = 0; i < 3; ++i) {
    attn::NadarayaWatsonRequest regression;
    regression.x_train = x_train.view();
    regression.y_train = y_train.view();
    const int64_t m = Uniform(1, 5);
    regression.x_query = Normal({m, dx});
    regression.bandwidth = 1.3f;
    requests.push_back(
        StoredRequest{regression, &x_train, nullptr, {m, dy}, {m, n}});
    EXPECT_EQ(ClassifyForBatching(requests.back())->key,
              ClassifyForBatching(requests.front())->key);
  }
  for (const OperationRequest& r : requests) pointers.push_back(&r);
  CombinedWork work;
  std::vector<absl::StatusOr<attn::OpResult>> results =
      RunTogether(*engine_, pointers, &work);
  EXPECT_EQ(work.combined_requests, 3);
  ASSERT_EQ(results.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    attn::NadarayaWatsonRequest plain = std::get<attn::NadarayaWatsonRequest>(
        std::get<StoredRequest>(requests[i]).request);
    plain.return_weights = true;  // the bounds are derived from them
    const attn::OpResult exact =
        attn::testing::ReferenceEngine().NadarayaWatson(plain).value();
    const attn::testing::ErrorBounds bounds =
        attn::testing::NadarayaWatsonBounds(plain, exact);
    EXPECT_EQ(results[i]->output.shape, exact.output.shape);
    EXPECT_TRUE(WithinBounds(results[i]->output, exact.output, bounds.output));
    EXPECT_EQ(OperationOf(requests[i]), Operation::kNadarayaWatson);
    EXPECT_EQ(ResultSizeOf(requests[i])->output_shape, exact.output.shape);
  }
  // Another stored version is another class, even with equal contents;
  // the same contents sent by a client are a third (keyed by their hash).
  StoredRequest other = std::get<StoredRequest>(requests[0]);
  other.version = &y_train;
  EXPECT_NE(ClassifyForBatching(other)->key,
            ClassifyForBatching(requests[0])->key);
  EXPECT_NE(ClassifyForBatching(std::get<attn::NadarayaWatsonRequest>(
                                    other.request))->key,
            ClassifyForBatching(requests[0])->key);
}

TEST_F(BatchableTest, OperandsThatDifferRunAloneWhateverTheirKey) {
  // As if two training sets collided in the hash: RunTogether still gives
  // each request its own training set's answer.
  // The first two share a training set and run together; the third runs
  // alone.
  std::vector<attn::NadarayaWatsonRequest> requests(3);
  for (attn::NadarayaWatsonRequest& r : requests) {
    r.x_train = Normal({40});
    r.y_train = Normal({40});
    r.x_query = Normal({Uniform(1, 10)});
    r.return_weights = true;
  }
  requests[1].x_train = requests[0].x_train;
  requests[1].y_train = requests[0].y_train;
  std::vector<OperationRequest> batchable(requests.begin(), requests.end());
  std::vector<const OperationRequest*> pointers;
  for (const OperationRequest& request : batchable) pointers.push_back(&request);
  CombinedWork work;
  const auto results = RunTogether(*engine_, pointers, &work);
  ASSERT_EQ(results.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok());
    const attn::OpResult exact =
        attn::testing::ReferenceEngine().NadarayaWatson(requests[i]).value();
    EXPECT_TRUE(WithinBounds(results[i]->output, exact.output,
                             BoundsFor(requests[i], exact).output));
  }
  int64_t useful = 0;
  for (const auto& r : requests) useful += r.x_query.shape[0] * 40;
  EXPECT_EQ(work.useful_elements, useful);
  EXPECT_EQ(work.combined_requests, 2);
  EXPECT_EQ(work.in_combined_call, (std::vector<bool>{true, true, false}));
}

TEST_F(BatchableTest, ClassKeysSeparateWhatMustNotShareABatch) {
  auto key = [](const OperationRequest& request) {
    return ClassifyForBatching(request).value().key;
  };
  // Attention: the scale by its bits (1 ulp apart), causal, precision.
  attn::AttentionRequest a;
  a.queries = Normal({1, 3, 4});
  a.keys = Normal({1, 5, 4});
  a.values = Normal({1, 5, 2});
  attn::AttentionRequest b = a;
  a.scale = 0.5f;
  b.scale = std::nextafter(0.5f, 1.0f);
  EXPECT_NE(key(a), key(b));
  b.scale = 0.5f;
  EXPECT_EQ(key(a), key(b));
  b.causal = true;
  EXPECT_NE(key(a), key(b));
  b.causal = false;
  b.precision = attn::Precision::kBFloat16;
  EXPECT_NE(key(a), key(b));
  // A different Lq and Lk share the class (padding).
  attn::AttentionRequest c = a;
  c.queries = Normal({2, 7, 4});
  c.keys = Normal({2, 9, 4});
  c.values = Normal({2, 9, 2});
  EXPECT_EQ(key(a), key(c));

  // Additive: equal weights from two clients share a class; other weights
  // do not.
  attn::AdditiveAttentionRequest d;
  d.queries = Normal({1, 2, 3});
  d.keys = Normal({1, 4, 5});
  d.values = Normal({1, 4, 2});
  d.w_q = Normal({6, 3});
  d.w_k = Normal({6, 5});
  d.w_v = Normal({6});
  attn::AdditiveAttentionRequest e = d;
  tensors_.push_back(attn::Tensor::Uninitialized(d.w_q.shape));
  std::copy(d.w_q.data, d.w_q.data + 18, tensors_.back().data.begin());
  e.w_q = tensors_.back().view();
  EXPECT_EQ(key(d), key(e));
  tensors_.back().data[17] += 1.0f;
  EXPECT_NE(key(d), key(e));

  // Nadaraya-Watson: the training set and the bandwidth.
  attn::NadarayaWatsonRequest f;
  f.x_train = Normal({10});
  f.y_train = Normal({10});
  f.x_query = Normal({3});
  attn::NadarayaWatsonRequest g = f;
  g.y_train = Normal({10});
  EXPECT_NE(key(f), key(g));
  g = f;
  g.bandwidth = std::nextafter(1.0f, 2.0f);
  EXPECT_NE(key(f), key(g));

  // Batch matmul: k and p must agree, m may differ.
  attn::BatchMatmulRequest h{Normal({1, 2, 3}), Normal({1, 3, 4}), {}};
  attn::BatchMatmulRequest i{Normal({2, 5, 3}), Normal({2, 3, 4}), {}};
  attn::BatchMatmulRequest j{Normal({1, 2, 3}), Normal({1, 3, 5}), {}};
  EXPECT_EQ(key(h), key(i));
  EXPECT_NE(key(h), key(j));

  // Different operations never share a class.
  attn::MaskedSoftmaxRequest k{Normal({1, 2, 3}), {}};
  EXPECT_NE(key(k), key(h));
  EXPECT_EQ(OperationOf(k), Operation::kMaskedSoftmax);
  EXPECT_EQ(OperationOf(f), Operation::kNadarayaWatson);
}

TEST_F(BatchableTest, InvalidRequestsAreRefusedInTheLibrarysWords) {
  attn::BatchMatmulRequest bad{Normal({1, 2, 3}), Normal({1, 4, 5}), {}};
  const absl::StatusOr<BatchClass> batch_class = ClassifyForBatching(bad);
  EXPECT_EQ(batch_class.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch_class.status().message().rfind("b:", 0), 0u)
      << batch_class.status();
}

}  // namespace
}  // namespace attnserve
