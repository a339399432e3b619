// The Engine's dispatch contract, proved with injected backends so that it
// holds on every machine whatever its CPU: the list is tried in order, a
// decline (UNIMPLEMENTED) passes the call on, any other failure is final, and
// a float32 kernel whose result overflowed on finite inputs is redone on the
// reference (which computes in double), while non-finite inputs propagate.
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/engine.h"
#include "attn/reference.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::RandomNormal;

// What a backend does with every call.
enum class Behaviour {
  kOverflow,  // succeeds, but writes +inf, as a float32 kernel whose scores
              // went past 3.4e38 would (its softmax then gives NaN)
  kDecline,   // UNIMPLEMENTED: the next backend takes the call
  kFail,      // INTERNAL: a library failure, final
};

// Its implementation that ran is reported as `implementation` (by default
// its own name).
class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend(std::string name, Behaviour behaviour,
                  std::string implementation)
      : name_(std::move(name)),
        behaviour_(behaviour),
        implementation_(implementation.empty() ? name_
                                               : std::move(implementation)) {}

  std::string name() const override { return name_; }
  int calls() const { return calls_; }

  absl::StatusOr<const char*> MaskedSoftmax(
      const MaskedSoftmaxParams& p) override {
    return Run(p.out, p.batch * p.rows * p.columns);
  }
  absl::StatusOr<const char*> BatchMatmul(const BatchMatmulParams& p) override {
    return Run(p.out, p.n * p.m * p.p);
  }
  absl::StatusOr<const char*> ScaledDotProductAttention(
      const AttentionParams& p) override {
    return Run(p.out, p.batch * p.heads * p.lq * p.dv);
  }
  absl::StatusOr<const char*> AdditiveAttention(
      const AdditiveAttentionParams& p) override {
    return Run(p.out, p.batch * p.lq * p.dv);
  }
  absl::StatusOr<const char*> NadarayaWatson(
      const NadarayaWatsonParams& p) override {
    return Run(p.out, p.n_query * p.dy);
  }

 private:
  absl::StatusOr<const char*> Run(float* out, int64_t count) {
    ++calls_;
    switch (behaviour_) {
      case Behaviour::kOverflow:
        for (int64_t i = 0; i < count; ++i) {
          out[i] = std::numeric_limits<float>::infinity();
        }
        return implementation_.c_str();
      case Behaviour::kDecline:
        return absl::UnimplementedError(name_ + " declines");
      case Behaviour::kFail:
        return absl::InternalError(name_ + " failed");
    }
    return implementation_.c_str();
  }

  const std::string name_;
  const Behaviour behaviour_;
  const std::string implementation_;
  int calls_ = 0;
};

struct Scripted {
  std::unique_ptr<Engine> engine;
  std::vector<ScriptedBackend*> backends;  // owned by the engine
};

// One backend per entry: its name, its behaviour and, where not empty, the
// implementation it reports.
struct Script {
  std::string name;
  Behaviour behaviour;
  std::string implementation = "";
};

Scripted EngineOf(std::vector<Script> script) {
  Scripted scripted;
  std::vector<std::unique_ptr<Backend>> list;
  for (auto& [name, behaviour, implementation] : script) {
    auto backend =
        std::make_unique<ScriptedBackend>(name, behaviour, implementation);
    scripted.backends.push_back(backend.get());
    list.push_back(std::move(backend));
  }
  auto engine = Engine::CreateWithBackends(std::move(list));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) scripted.engine = std::move(engine).value();
  return scripted;
}

std::unique_ptr<Engine> ReferenceOnly() {
  std::vector<std::unique_ptr<Backend>> list;
  list.push_back(std::make_unique<ReferenceBackend>());
  return Engine::CreateWithBackends(std::move(list)).value();
}

class EngineDispatchTest : public ::testing::Test {
 protected:
  EngineDispatchTest()
      : rng_(11),
        q_(RandomNormal(rng_, {2, 3, 4})),
        k_(RandomNormal(rng_, {2, 5, 4})),
        v_(RandomNormal(rng_, {2, 5, 6})),
        w_q_(RandomNormal(rng_, {7, 4})),
        w_k_(RandomNormal(rng_, {7, 4})),
        w_v_(RandomNormal(rng_, {7})) {}

  AttentionRequest ScaledDotProductAttention() const {
    AttentionRequest request;
    request.queries = q_.view();
    request.keys = k_.view();
    request.values = v_.view();
    request.return_weights = true;
    return request;
  }
  AdditiveAttentionRequest Additive() const {
    AdditiveAttentionRequest request;
    request.queries = q_.view();
    request.keys = k_.view();
    request.values = v_.view();
    request.w_q = w_q_.view();
    request.w_k = w_k_.view();
    request.w_v = w_v_.view();
    return request;
  }
  MaskedSoftmaxRequest Softmax() const {
    MaskedSoftmaxRequest request;
    request.x = k_.view();
    return request;
  }
  NadarayaWatsonRequest Regression() const {
    NadarayaWatsonRequest request;
    request.x_train = TensorView{k_.data.data(), {10}};
    request.y_train = TensorView{v_.data.data(), {10}};
    request.x_query = TensorView{q_.data.data(), {6}};
    return request;
  }

  std::mt19937 rng_;
  Tensor q_, k_, v_, w_q_, w_k_, w_v_;
};

TEST_F(EngineDispatchTest, ReferenceIsAppendedAndNullRejected) {
  Scripted scripted = EngineOf({{"first", Behaviour::kDecline}});
  EXPECT_EQ(scripted.engine->backend_names(),
            (std::vector<std::string>{"first", "reference"}));
  std::vector<std::unique_ptr<Backend>> with_null;
  with_null.push_back(nullptr);
  EXPECT_EQ(Engine::CreateWithBackends(std::move(with_null)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineDispatchTest, DeclinedCallsGoToTheNextBackend) {
  Scripted scripted = EngineOf({{"declines", Behaviour::kDecline},
                                {"overflows", Behaviour::kOverflow}});
  auto result = scripted.engine->BatchMatmul(
      BatchMatmulRequest{q_.view(), TensorView{k_.data.data(), {2, 4, 5}}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->implementation, "overflows");
  EXPECT_EQ(result->backend, "overflows");
  EXPECT_EQ(scripted.backends[0]->calls(), 1);
  EXPECT_EQ(scripted.backends[1]->calls(), 1);
}

// The result names the implementation the backend says ran, and the
// backend; an overflow redone in double names the reference for both.
TEST_F(EngineDispatchTest, ResultsNameTheImplementationAndItsBackend) {
  Scripted scripted = EngineOf(
      {{"declines", Behaviour::kDecline, "never-runs"},
       {"overflows", Behaviour::kOverflow, "overflowing-kernel"}});
  auto product = scripted.engine->BatchMatmul(
      BatchMatmulRequest{q_.view(), TensorView{k_.data.data(), {2, 4, 5}}});
  ASSERT_TRUE(product.ok()) << product.status();
  EXPECT_EQ(product->implementation, "overflowing-kernel");
  EXPECT_EQ(product->backend, "overflows");
  auto redone =
      scripted.engine->ScaledDotProductAttention(ScaledDotProductAttention());
  ASSERT_TRUE(redone.ok()) << redone.status();
  EXPECT_EQ(redone->implementation, "reference");
  EXPECT_EQ(redone->backend, "reference");
}

// A backend with one implementation of everything lists its own name.
TEST_F(EngineDispatchTest, ImplementationNamesDefaultToTheBackendName) {
  ScriptedBackend backend("plain", Behaviour::kDecline, "");
  EXPECT_EQ(backend.implementation_names(),
            std::vector<std::string>{"plain"});
  EXPECT_EQ(ReferenceBackend().implementation_names(),
            std::vector<std::string>{"reference"});
}

TEST_F(EngineDispatchTest, FailuresOtherThanDeclineAreFinal) {
  Scripted scripted = EngineOf({{"fails", Behaviour::kFail}});
  auto result =
      scripted.engine->ScaledDotProductAttention(ScaledDotProductAttention());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(result.status().message().find("fails failed"), std::string::npos);
}

// Every softmax-based operation: an overflowing result from finite inputs is
// replaced by the reference's, and says so.
TEST_F(EngineDispatchTest, OverflowOnFiniteInputsIsRedoneOnTheReference) {
  Scripted scripted = EngineOf({{"overflows", Behaviour::kOverflow}});
  Engine& engine = *scripted.engine;
  std::unique_ptr<Engine> reference = ReferenceOnly();

  auto expect_redone = [](const absl::StatusOr<OpResult>& got,
                          const absl::StatusOr<OpResult>& want) {
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(got->implementation, "reference");
    EXPECT_EQ(got->backend, "reference");
    // The same backend on the same inputs: the same bits.
    EXPECT_EQ(got->output.data, want->output.data);
    EXPECT_EQ(got->weights.data, want->weights.data);
  };
  expect_redone(
      engine.ScaledDotProductAttention(ScaledDotProductAttention()),
      reference->ScaledDotProductAttention(ScaledDotProductAttention()));
  expect_redone(engine.AdditiveAttention(Additive()),
                reference->AdditiveAttention(Additive()));
  expect_redone(engine.MaskedSoftmax(Softmax()),
                reference->MaskedSoftmax(Softmax()));
  expect_redone(engine.NadarayaWatson(Regression()),
                reference->NadarayaWatson(Regression()));
  EXPECT_EQ(scripted.backends[0]->calls(), 4);
}

// A product that overflows float32 is out of range in double too: no redo.
TEST_F(EngineDispatchTest, BatchMatmulOverflowStands) {
  Scripted scripted = EngineOf({{"overflows", Behaviour::kOverflow}});
  auto result = scripted.engine->BatchMatmul(
      BatchMatmulRequest{q_.view(), TensorView{k_.data.data(), {2, 4, 5}}});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->implementation, "overflows");
  EXPECT_TRUE(std::isinf(result->output.data[0]));
}

// Non-finite inputs are the caller's: the first backend's answer stands.
TEST_F(EngineDispatchTest, NonFiniteInputsPropagate) {
  Scripted scripted = EngineOf({{"overflows", Behaviour::kOverflow}});
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    const float saved = k_.data[3];
    k_.data[3] = bad;
    auto result =
        scripted.engine->ScaledDotProductAttention(ScaledDotProductAttention());
    k_.data[3] = saved;
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->implementation, "overflows");
    EXPECT_FALSE(std::isfinite(result->output.data[0]));
  }
}

}  // namespace
}  // namespace attn
