// The work threshold that keeps small calls off the GPU, proved with a
// stand-in for the GPU backend so that it holds on every machine: a call
// below the threshold runs on the next backend (and gives exactly what that
// backend gives), a call at or above it on the wrapped one, for every
// operation; the threshold counts work as attn/work.h documents.
#include "attn/minimum_work_backend.h"

#include <array>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/engine.h"
#include "attn/reference.h"
#include "attn/testing/random.h"
#include "attn/work.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::RandomNormal;

constexpr float kMarker = 7.0f;

// Stands in for the GPU: counts its calls and fills every output with a
// marker no softmax-based result can equal, so a test sees who ran.
class StandInBackend final : public Backend {
 public:
  std::string name() const override { return "stand-in"; }
  std::string description() const override { return "stand-in (a GPU)"; }
  int calls() const { return calls_; }

  absl::StatusOr<const char*> MaskedSoftmax(
      const MaskedSoftmaxParams& p) override {
    return Fill(p.out, p.batch * p.rows * p.columns, nullptr, 0);
  }
  absl::StatusOr<const char*> BatchMatmul(const BatchMatmulParams& p) override {
    return Fill(p.out, p.n * p.m * p.p, nullptr, 0);
  }
  absl::StatusOr<const char*> ScaledDotProductAttention(
      const AttentionParams& p) override {
    return Fill(p.out, p.batch * p.heads * p.lq * p.dv, p.weights,
                p.batch * p.heads * p.lq * p.lk);
  }
  absl::StatusOr<const char*> AdditiveAttention(
      const AdditiveAttentionParams& p) override {
    return Fill(p.out, p.batch * p.lq * p.dv, p.weights,
                p.batch * p.lq * p.lk);
  }
  absl::StatusOr<const char*> NadarayaWatson(
      const NadarayaWatsonParams& p) override {
    return Fill(p.out, p.n_query * p.dy, p.weights, p.n_query * p.n_train);
  }

 private:
  const char* Fill(float* out, int64_t count, float* weights,
                   int64_t weight_count) {
    ++calls_;
    for (int64_t i = 0; i < count; ++i) out[i] = kMarker;
    for (int64_t i = 0; weights != nullptr && i < weight_count; ++i) {
      weights[i] = kMarker;
    }
    return "stand-in";
  }

  int calls_ = 0;
};

// An engine {stand-in behind the threshold, reference}.
struct Routed {
  std::unique_ptr<Engine> engine;
  StandInBackend* stand_in = nullptr;  // owned by the engine
};

Routed RoutedEngine(double min_flops) {
  Routed routed;
  auto stand_in = std::make_unique<StandInBackend>();
  routed.stand_in = stand_in.get();
  std::vector<std::unique_ptr<Backend>> list;
  list.push_back(
      std::make_unique<MinimumWorkBackend>(std::move(stand_in), min_flops));
  list.push_back(std::make_unique<ReferenceBackend>());
  routed.engine = Engine::CreateWithBackends(std::move(list)).value();
  return routed;
}

std::unique_ptr<Engine> ReferenceOnly() {
  std::vector<std::unique_ptr<Backend>> list;
  list.push_back(std::make_unique<ReferenceBackend>());
  return Engine::CreateWithBackends(std::move(list)).value();
}

// One call of some operation, on any engine.
using Call = std::function<absl::StatusOr<OpResult>(Engine&)>;

// Inputs that outlive the calls made of them.
class Inputs {
 public:
  explicit Inputs(int seed) : rng_(seed) {}
  TensorView Normal(Shape shape) {
    tensors_.push_back(
        std::make_unique<Tensor>(RandomNormal(rng_, std::move(shape))));
    return tensors_.back()->view();
  }

 private:
  std::mt19937 rng_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
};

struct OpCase {
  std::string op;
  double flops;  // counted by hand from the shapes, as attn/work.h says
  Call call;
};

// Every operation at one size: `scale` 1 is small (tens to hundreds of
// flops), 10 is large (10^5 and more).
std::vector<OpCase> EveryOperation(Inputs& in, int64_t scale) {
  const int64_t s = scale;
  std::vector<OpCase> cases;
  {
    MaskedSoftmaxRequest r;
    r.x = in.Normal({2, 3 * s, 5 * s});
    cases.push_back({"masked_softmax", 10.0 * 2 * 3 * s * 5 * s,
                     [r](Engine& e) { return e.MaskedSoftmax(r); }});
  }
  {
    BatchMatmulRequest r;
    r.a = in.Normal({2, 3 * s, 4 * s});
    r.b = in.Normal({2, 4 * s, 5 * s});
    cases.push_back({"batch_matmul", 2.0 * 2 * 3 * s * 4 * s * 5 * s,
                     [r](Engine& e) { return e.BatchMatmul(r); }});
  }
  {
    AttentionRequest r;
    r.queries = in.Normal({2, 3 * s, 4});
    r.keys = in.Normal({2, 5 * s, 4});
    r.values = in.Normal({2, 5 * s, 6});
    r.return_weights = true;
    cases.push_back(
        {"attention", 2.0 * 2 * 3 * s * 5 * s * (4 + 6),
         [r](Engine& e) { return e.ScaledDotProductAttention(r); }});
  }
  {
    AdditiveAttentionRequest r;
    r.queries = in.Normal({2, 3 * s, 4});
    r.keys = in.Normal({2, 5 * s, 6});
    r.values = in.Normal({2, 5 * s, 2});
    r.w_q = in.Normal({8, 4});
    r.w_k = in.Normal({8, 6});
    r.w_v = in.Normal({8});
    r.return_weights = true;
    const double pairs = 2.0 * 3 * s * 5 * s;
    cases.push_back(
        {"additive_attention",
         2.0 * 2 * (3 * s * 4 + 5 * s * 6) * 8 + 12.0 * pairs * 8 +
             2.0 * pairs * 2,
         [r](Engine& e) { return e.AdditiveAttention(r); }});
  }
  {
    NadarayaWatsonRequest r;
    r.x_train = in.Normal({5 * s, 1});
    r.y_train = in.Normal({5 * s, 2});
    r.x_query = in.Normal({3 * s, 1});
    r.return_weights = true;
    cases.push_back({"nadaraya_watson", 3.0 * s * 5 * s * (3 + 10 + 2 * 2),
                     [r](Engine& e) { return e.NadarayaWatson(r); }});
  }
  return cases;
}

bool AllMarker(const Tensor& tensor) {
  for (float value : tensor.data) {
    if (value != kMarker) return false;
  }
  return !tensor.data.empty();
}

TEST(MinimumWorkBackendTest, CallsBelowTheThresholdRunOnTheNextBackend) {
  Inputs in(5);
  std::unique_ptr<Engine> reference = ReferenceOnly();
  for (int64_t scale : {1, 10}) {
    for (const OpCase& c : EveryOperation(in, scale)) {
      SCOPED_TRACE(c.op + " at scale " + std::to_string(scale));
      // Just above the call's work: the next backend runs it, and its result
      // is exactly the reference's.
      Routed above = RoutedEngine(c.flops + 1);
      absl::StatusOr<OpResult> declined = c.call(*above.engine);
      ASSERT_TRUE(declined.ok()) << declined.status();
      EXPECT_EQ(declined->implementation, "reference");
      EXPECT_EQ(above.stand_in->calls(), 0);
      absl::StatusOr<OpResult> expected = c.call(*reference);
      ASSERT_TRUE(expected.ok()) << expected.status();
      EXPECT_EQ(declined->output.data, expected->output.data);
      EXPECT_EQ(declined->weights.data, expected->weights.data);

      // Exactly the call's work: the wrapped backend runs it.
      Routed at = RoutedEngine(c.flops);
      absl::StatusOr<OpResult> taken = c.call(*at.engine);
      ASSERT_TRUE(taken.ok()) << taken.status();
      EXPECT_EQ(taken->implementation, "stand-in");
      EXPECT_EQ(at.stand_in->calls(), 1);
      EXPECT_TRUE(AllMarker(taken->output));
    }
  }
}

TEST(MinimumWorkBackendTest, EstimatesMatchTheDocumentedCounts) {
  // The routing above hinges on EstimatedFlops: check the estimate directly
  // for one params struct per operation, counted by hand.
  MaskedSoftmaxParams softmax;
  softmax.batch = 2, softmax.rows = 3, softmax.columns = 5;
  EXPECT_EQ(EstimatedFlops(softmax), 300.0);
  BatchMatmulParams matmul;
  matmul.n = 2, matmul.m = 3, matmul.k = 4, matmul.p = 5;
  EXPECT_EQ(EstimatedFlops(matmul), 240.0);
  AttentionParams attention;
  attention.batch = 2, attention.heads = 3, attention.lq = 4,
  attention.lk = 5, attention.d = 6, attention.dv = 7;
  EXPECT_EQ(EstimatedFlops(attention), 2.0 * 2 * 3 * 4 * 5 * 13);
  AdditiveAttentionParams additive;
  additive.batch = 1, additive.lq = 2, additive.lk = 3, additive.dq = 4,
  additive.dk = 5, additive.h = 6, additive.dv = 7;
  EXPECT_EQ(EstimatedFlops(additive),
            2.0 * (8 + 15) * 6 + 12.0 * 6 * 6 + 2.0 * 6 * 7);
  NadarayaWatsonParams regression;
  regression.n_query = 3, regression.n_train = 4, regression.dx = 2,
  regression.dy = 1;
  EXPECT_EQ(EstimatedFlops(regression), 12.0 * (6 + 10 + 2));
}

TEST(MinimumWorkBackendTest, ZeroThresholdTakesEveryCall) {
  Inputs in(6);
  Routed routed = RoutedEngine(0);
  int expected_calls = 0;
  for (const OpCase& c : EveryOperation(in, 1)) {
    SCOPED_TRACE(c.op);
    absl::StatusOr<OpResult> result = c.call(*routed.engine);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->implementation, "stand-in");
    EXPECT_EQ(routed.stand_in->calls(), ++expected_calls);
  }
}

TEST(MinimumWorkBackendTest, NamesTheWrappedBackendAndSaysTheThreshold) {
  MinimumWorkBackend routed(std::make_unique<StandInBackend>(), 2.5e6);
  EXPECT_EQ(routed.name(), "stand-in");
  EXPECT_EQ(routed.implementation_names(),
            std::vector<std::string>{"stand-in"});
  EXPECT_EQ(routed.min_work().attention, 2.5e6);
  EXPECT_EQ(routed.min_work().masked_softmax, 2.5e6);
  EXPECT_NE(routed.description().find("stand-in (a GPU)"), std::string::npos);
  EXPECT_NE(routed.description().find("2.5e+06 flops"), std::string::npos)
      << routed.description();
  MinimumWorkBackend open(std::make_unique<StandInBackend>(), 0);
  EXPECT_EQ(open.description(), "stand-in (a GPU)");
}

TEST(MinimumWorkBackendTest, EachOperationHasItsOwnThresholdAndNeverMeansNever) {
  // Masked softmax and batch matmul kept off the wrapped backend however
  // large; attention from 0; the other two from a threshold between the
  // small and the large calls.
  MinimumWork work;
  work.masked_softmax = MinimumWork::kNever;
  work.batch_matmul = MinimumWork::kNever;
  work.attention = 0;
  work.additive_attention = 1e4;
  work.nadaraya_watson = 1e4;
  auto stand_in = std::make_unique<StandInBackend>();
  StandInBackend* raw = stand_in.get();
  std::vector<std::unique_ptr<Backend>> list;
  list.push_back(std::make_unique<MinimumWorkBackend>(std::move(stand_in), work));
  list.push_back(std::make_unique<ReferenceBackend>());
  std::unique_ptr<Engine> engine =
      Engine::CreateWithBackends(std::move(list)).value();
  EXPECT_NE(engine->backend_descriptions().front().find(
                "masked_softmax never, batch_matmul never, attention from 0 "
                "flops, additive_attention from 10000 flops"),
            std::string::npos)
      << engine->backend_descriptions().front();
  Inputs in(9);
  for (int64_t scale : {1, 10}) {
    for (const OpCase& c : EveryOperation(in, scale)) {
      SCOPED_TRACE(c.op + " at scale " + std::to_string(scale));
      ASSERT_NE(work.Find(c.op), nullptr);
      const double threshold = *work.Find(c.op);
      const int before = raw->calls();
      absl::StatusOr<OpResult> result = c.call(*engine);
      ASSERT_TRUE(result.ok()) << result.status();
      const bool wrapped = c.flops >= threshold;
      EXPECT_EQ(result->implementation, wrapped ? "stand-in" : "reference");
      EXPECT_EQ(raw->calls(), before + (wrapped ? 1 : 0));
    }
  }
}

TEST(MinimumWorkBackendTest, DeclinesBeforeWritingAnyOutput) {
  // The backend contract: a decline leaves the outputs as they were.
  std::array<float, 4> out = {1, 2, 3, 4};
  std::array<float, 4> x = {0, 0, 0, 0};
  MaskedSoftmaxParams params;
  params.x = x.data();
  params.out = out.data();
  params.batch = 1, params.rows = 1, params.columns = 4;
  MinimumWorkBackend routed(std::make_unique<StandInBackend>(), 1e6);
  EXPECT_EQ(routed.MaskedSoftmax(params).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(out, (std::array<float, 4>{1, 2, 3, 4}));
}

TEST(MinimumWorkBackendTest, WarmUpReachesTheWrappedBackendWhateverTheThreshold) {
  // Warm-up calls are tiny; they must still load the GPU's kernels.
  Routed routed = RoutedEngine(1e12);
  ASSERT_TRUE(routed.engine->WarmUp().ok());
  EXPECT_GT(routed.stand_in->calls(), 0);
  // And the threshold holds again afterwards.
  const int warm_calls = routed.stand_in->calls();
  Inputs in(7);
  for (const OpCase& c : EveryOperation(in, 1)) {
    SCOPED_TRACE(c.op);
    absl::StatusOr<OpResult> result = c.call(*routed.engine);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->implementation, "reference");
  }
  EXPECT_EQ(routed.stand_in->calls(), warm_calls);
}

}  // namespace
}  // namespace attn
