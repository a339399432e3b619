// In-process tests of attention.v1.AttentionService: a real gRPC server on a
// loopback port, called through the generated stub, every RPC checked
// against the library's reference backend, and every class of bad input.
#include "server/typed/attention_service.h"

#include "server/execution/execution_stack.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attn/engine.h"
#include "attn/testing/compare.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "attn/bfloat16.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "server/models/model_catalogue.h"
#include "server/models/model_kinds.h"

namespace attnserve {
namespace {

namespace v1 = ::attention::v1;
using ::testing::HasSubstr;

v1::Tensor RandomTensor(std::mt19937& rng, const std::vector<int64_t>& shape,
                        bool raw = false) {
  v1::Tensor tensor;
  int64_t count = 1;
  for (int64_t dim : shape) {
    tensor.add_shape(dim);
    count *= dim;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  if (raw) {
    tensor.set_raw(reinterpret_cast<const char*>(values.data()),
                   values.size() * sizeof(float));
  } else {
    tensor.mutable_values()->Assign(values.begin(), values.end());
  }
  return tensor;
}

attn::Tensor ToTensor(const v1::Tensor& tensor) {
  attn::Tensor out;
  out.shape.assign(tensor.shape().begin(), tensor.shape().end());
  if (!tensor.raw().empty()) {
    out.data.resize(tensor.raw().size() / sizeof(float));
    std::memcpy(out.data.data(), tensor.raw().data(), tensor.raw().size());
  } else {
    out.data.assign(tensor.values().begin(), tensor.values().end());
  }
  return out;
}

attn::TensorView View(const attn::Tensor& tensor) { return tensor.view(); }

// The merge's bound for a memory served in pieces (the piece_error of
// attn/testing/error_bounds.h): the largest bound on the log-sum-exp of
// `like`'s queries over any one piece, its keys [n_i, d] and values
// [n_i, v] repeated for `batch` entries, from `reference`'s exact answer.
double PieceError(attn::Engine& reference, const attn::AttentionRequest& like,
                  const std::vector<std::pair<attn::Tensor, attn::Tensor>>& pieces,
                  int64_t batch) {
  double piece_error = 0.0;
  for (const auto& [piece_keys, piece_values] : pieces) {
    const attn::Tensor keys = attn::testing::RepeatAsBatch(piece_keys, batch);
    const attn::Tensor values =
        attn::testing::RepeatAsBatch(piece_values, batch);
    attn::AttentionRequest piece = like;
    piece.keys = View(keys);
    piece.values = View(values);
    piece.return_log_sum_exp = true;
    const attn::OpResult exact =
        reference.ScaledDotProductAttention(piece).value();
    for (float bound :
         attn::testing::AttentionBounds(piece, exact).log_sum_exp.data) {
      piece_error = std::max<double>(piece_error, bound);
    }
  }
  return piece_error;
}

// Parameterized on server-side batching (on, off): every RPC must behave the
// same either way.
class ServiceTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    Start(/*threads=*/2, /*max_queue=*/64, /*batching=*/GetParam());
  }
  void TearDown() override { Stop(); }

  void Start(int threads, int max_queue, bool batching) {
    attn::EngineOptions reference_options;
    reference_options.use_onednn = false;
    reference_ = attn::Engine::Create(reference_options).value();
    // The production assembly (server/execution/execution_stack.h), batching
    // included: its availability check, idle callback and observer.
    ExecutionStack::Options options;
    options.workers.threads = threads;
    options.workers.max_queue = max_queue;
    if (batching) {
      BatchingOptions batcher;
      batcher.max_batch_requests = 8;
      batcher.max_queue_delay = absl::Microseconds(300);
      batcher.max_queue_size = max_queue;
      options.batching = batcher;
    }
    options.limits.max_request_elements = 100000;
    options.limits.max_response_bytes = 4 << 20;
    core_ = ExecutionStack::Create(
                options, attn::Engine::Create(attn::EngineOptions{}).value())
                .value();
    service_ = std::make_unique<AttentionService>(&core_->calls());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port),
        grpc::InsecureChannelCredentials()));
  }

  void Stop() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
      server_->Wait();
      server_.reset();
    }
    if (core_ != nullptr) core_->Shutdown();
  }

  // The sum of a counter family's samples whose labels include all of
  // `labels`.
  double CounterSum(const std::string& family,
                    const std::map<std::string, std::string>& labels) {
    double sum = 0;
    for (const prometheus::MetricFamily& f : core_->metrics().registry()->Collect()) {
      if (f.name != family) continue;
      for (const prometheus::ClientMetric& metric : f.metric) {
        int matched = 0;
        for (const auto& label : metric.label) {
          auto it = labels.find(label.name);
          if (it != labels.end() && it->second == label.value) ++matched;
        }
        if (matched == static_cast<int>(labels.size())) {
          sum += metric.counter.value;
        }
      }
    }
    return sum;
  }

  std::unique_ptr<attn::Engine> reference_;
  std::unique_ptr<ExecutionStack> core_;
  std::unique_ptr<AttentionService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

TEST_P(ServiceTest, AttentionToyCaseMatchesReference) {
  std::mt19937 rng(0);
  v1::AttentionRequest request;
  *request.mutable_queries() = RandomTensor(rng, {2, 1, 2});
  *request.mutable_keys() = RandomTensor(rng, {2, 10, 2}, /*raw=*/true);
  *request.mutable_values() = RandomTensor(rng, {2, 10, 4});
  request.mutable_valid_lens()->add_shape(2);
  request.mutable_valid_lens()->add_values(2);
  request.mutable_valid_lens()->add_values(6);
  request.set_return_weights(true);
  for (auto encoding : {v1::TENSOR_ENCODING_VALUES, v1::TENSOR_ENCODING_RAW}) {
    request.set_output_encoding(encoding);
    grpc::ClientContext context;
    v1::AttentionResponse response;
    ASSERT_TRUE(stub_->ScaledDotProductAttention(&context, request, &response).ok());
    EXPECT_EQ(response.info().implementation(), "cpu-weights-blocks");
    const attn::Tensor q = ToTensor(request.queries());
    const attn::Tensor k = ToTensor(request.keys());
    const attn::Tensor v = ToTensor(request.values());
    const std::vector<int32_t> lens = {2, 6};
    attn::AttentionRequest op;
    op.queries = View(q);
    op.keys = View(k);
    op.values = View(v);
    op.valid_lens = {lens.data(), {2}};
    op.return_weights = true;
    const attn::OpResult expected =
        reference_->ScaledDotProductAttention(op).value();
    const attn::testing::ErrorBounds bounds =
        attn::testing::AttentionBounds(op, expected);
    const attn::Tensor weights = ToTensor(response.weights());
    EXPECT_TRUE(attn::testing::WithinBounds(weights, expected.weights,
                                            bounds.weights));
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.output()),
                                            expected.output, bounds.output));
    EXPECT_TRUE(attn::testing::AllExactly(weights, 0.0f, 2, 10));
    EXPECT_TRUE(attn::testing::AllExactly(weights, 0.0f, 16, 20));
  }
}

TEST_P(ServiceTest, EveryRpcMatchesReference) {
  std::mt19937 rng(1);
  {
    v1::MaskedSoftmaxRequest request;
    *request.mutable_x() = RandomTensor(rng, {3, 5, 7});
    request.mutable_valid_lens()->add_shape(3);
    request.mutable_valid_lens()->add_shape(5);
    for (int i = 0; i < 15; ++i) request.mutable_valid_lens()->add_values(i % 8);
    grpc::ClientContext context;
    v1::MaskedSoftmaxResponse response;
    ASSERT_TRUE(stub_->MaskedSoftmax(&context, request, &response).ok());
    const attn::Tensor x = ToTensor(request.x());
    attn::MaskedSoftmaxRequest op;
    op.x = View(x);
    op.valid_lens = {request.valid_lens().values().data(), {3, 5}};
    const attn::OpResult expected = reference_->MaskedSoftmax(op).value();
    EXPECT_TRUE(attn::testing::WithinBounds(
        ToTensor(response.output()), expected.output,
        attn::testing::MaskedSoftmaxBounds(op, expected).output));
  }
  {
    v1::BatchMatmulRequest request;
    *request.mutable_a() = RandomTensor(rng, {2, 3, 4});
    *request.mutable_b() = RandomTensor(rng, {2, 4, 5});
    grpc::ClientContext context;
    v1::BatchMatmulResponse response;
    ASSERT_TRUE(stub_->BatchMatmul(&context, request, &response).ok());
    const attn::Tensor a = ToTensor(request.a()), b = ToTensor(request.b());
    attn::BatchMatmulRequest op;
    op.a = View(a);
    op.b = View(b);
    const attn::OpResult expected = reference_->BatchMatmul(op).value();
    EXPECT_TRUE(attn::testing::WithinBounds(
        ToTensor(response.output()), expected.output,
        attn::testing::BatchMatmulBounds(op, expected).output));
  }
  {
    v1::AdditiveAttentionRequest request;
    *request.mutable_queries() = RandomTensor(rng, {2, 3, 5});
    *request.mutable_keys() = RandomTensor(rng, {2, 4, 6});
    *request.mutable_values() = RandomTensor(rng, {2, 4, 3});
    *request.mutable_weights()->mutable_w_q() = RandomTensor(rng, {7, 5});
    *request.mutable_weights()->mutable_w_k() = RandomTensor(rng, {7, 6});
    *request.mutable_weights()->mutable_w_v() = RandomTensor(rng, {7});
    request.set_return_weights(true);
    grpc::ClientContext context;
    v1::AdditiveAttentionResponse response;
    ASSERT_TRUE(stub_->AdditiveAttention(&context, request, &response).ok());
    const attn::Tensor q = ToTensor(request.queries()), k = ToTensor(request.keys()),
                       v = ToTensor(request.values()),
                       wq = ToTensor(request.weights().w_q()),
                       wk = ToTensor(request.weights().w_k()),
                       wv = ToTensor(request.weights().w_v());
    attn::AdditiveAttentionRequest op;
    op.queries = View(q);
    op.keys = View(k);
    op.values = View(v);
    op.w_q = View(wq);
    op.w_k = View(wk);
    op.w_v = View(wv);
    op.return_weights = true;
    const attn::OpResult expected = reference_->AdditiveAttention(op).value();
    const attn::testing::ErrorBounds bounds =
        attn::testing::AdditiveAttentionBounds(op, expected);
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.output()),
                                            expected.output, bounds.output));
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.weights()),
                                            expected.weights, bounds.weights));
  }
  {
    v1::NadarayaWatsonRequest request;
    *request.mutable_x_train() = RandomTensor(rng, {50});
    *request.mutable_y_train() = RandomTensor(rng, {50});
    *request.mutable_x_query() = RandomTensor(rng, {20});
    request.set_kernel(v1::REGRESSION_KERNEL_EPANECHNIKOV);
    request.set_bandwidth(0.7f);
    grpc::ClientContext context;
    v1::NadarayaWatsonResponse response;
    ASSERT_TRUE(stub_->NadarayaWatson(&context, request, &response).ok());
    const attn::Tensor xt = ToTensor(request.x_train()),
                       yt = ToTensor(request.y_train()),
                       xq = ToTensor(request.x_query());
    attn::NadarayaWatsonRequest op;
    op.x_train = View(xt);
    op.y_train = View(yt);
    op.x_query = View(xq);
    op.kernel = attn::RegressionKernel::kEpanechnikov;
    op.bandwidth = 0.7f;
    op.return_weights = true;  // the bounds need them
    const attn::OpResult expected = reference_->NadarayaWatson(op).value();
    EXPECT_TRUE(attn::testing::WithinBounds(
        ToTensor(response.output()), expected.output,
        attn::testing::NadarayaWatsonBounds(op, expected).output));
  }
  {
    v1::FitBandwidthRequest request;
    std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
    std::vector<float> x(50), y(50);
    for (float& value : x) value = uniform(rng);
    std::sort(x.begin(), x.end());
    std::normal_distribution<float> noise(0.0f, 0.5f);
    for (int i = 0; i < 50; ++i) {
      y[i] = 2 * std::sin(x[i]) + std::pow(x[i], 0.8f) + noise(rng);
    }
    request.mutable_x_train()->add_shape(50);
    request.mutable_x_train()->mutable_values()->Assign(x.begin(), x.end());
    request.mutable_y_train()->add_shape(50);
    request.mutable_y_train()->mutable_values()->Assign(y.begin(), y.end());
    grpc::ClientContext context;
    v1::FitBandwidthResponse response;
    ASSERT_TRUE(stub_->FitBandwidth(&context, request, &response).ok());
    ASSERT_EQ(response.loss_per_epoch_size(), 5);
    EXPECT_LT(response.final_loss(), response.loss_per_epoch(0));
  }
}

// Each malformed request gets INVALID_ARGUMENT naming the field.
TEST_P(ServiceTest, BadInputNamesTheField) {
  std::mt19937 rng(2);
  auto call = [&](const v1::AttentionRequest& request) {
    grpc::ClientContext context;
    v1::AttentionResponse response;
    return stub_->ScaledDotProductAttention(&context, request, &response);
  };
  v1::AttentionRequest good;
  *good.mutable_queries() = RandomTensor(rng, {2, 3, 4});
  *good.mutable_keys() = RandomTensor(rng, {2, 5, 4});
  *good.mutable_values() = RandomTensor(rng, {2, 5, 6});
  ASSERT_TRUE(call(good).ok());

  struct Case {
    std::string name;
    std::function<void(v1::AttentionRequest*)> mutate;
    grpc::StatusCode code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"missing keys", [](auto* r) { r->clear_keys(); },
       grpc::StatusCode::INVALID_ARGUMENT, "keys: expected shape"},
      {"depth mismatch",
       [&](auto* r) { *r->mutable_keys() = RandomTensor(rng, {2, 5, 3}); },
       grpc::StatusCode::INVALID_ARGUMENT, "keys: expected shape (2, Lk, 4), got (2, 5, 3)"},
      {"too few values",
       [](auto* r) { r->mutable_values()->mutable_values()->RemoveLast(); },
       grpc::StatusCode::INVALID_ARGUMENT, "values: shape (2, 5, 6) needs 60 values, got 59"},
      {"raw size", [](auto* r) {
         r->mutable_queries()->clear_values();
         r->mutable_queries()->set_raw(std::string(7, '\0'));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "queries: shape (2, 3, 4) needs 96 raw bytes"},
      {"both encodings",
       [](auto* r) { r->mutable_queries()->set_raw(std::string(96, '\0')); },
       grpc::StatusCode::INVALID_ARGUMENT, "queries: set exactly one of values and raw"},
      {"nan", [](auto* r) { r->mutable_keys()->set_values(3, NAN); },
       grpc::StatusCode::INVALID_ARGUMENT, "keys: element 3 is nan"},
      {"infinity", [](auto* r) { r->mutable_values()->set_values(0, INFINITY); },
       grpc::StatusCode::INVALID_ARGUMENT, "values: element 0 is inf"},
      {"zero dimension", [](auto* r) { r->mutable_queries()->set_shape(1, 0); },
       grpc::StatusCode::INVALID_ARGUMENT, "queries: dimension 1"},
      {"overflowing shape", [](auto* r) {
         r->mutable_queries()->set_shape(0, int64_t{1} << 40);
         r->mutable_queries()->set_shape(1, int64_t{1} << 40);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "queries: shape"},
      {"valid length too long", [](auto* r) {
         r->mutable_valid_lens()->add_shape(2);
         r->mutable_valid_lens()->add_values(1);
         r->mutable_valid_lens()->add_values(6);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "valid_lens: element 1 is 6"},
      {"valid lengths count", [](auto* r) {
         r->mutable_valid_lens()->add_shape(2);
         r->mutable_valid_lens()->add_values(1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "valid_lens: shape (2) needs 2 values, got 1"},
      {"bad scale", [](auto* r) { r->set_scale(-1.0f); },
       grpc::StatusCode::INVALID_ARGUMENT, "scale: must be finite and positive"},
      {"unknown enum", [](auto* r) { r->set_score(static_cast<v1::Score>(9)); },
       grpc::StatusCode::INVALID_ARGUMENT, "score: unknown enum value 9"},
      {"over the element limit",
       [&](auto* r) { *r->mutable_keys() = RandomTensor(rng, {2, 20000, 4}); },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "100000 elements per request"},
  };
  for (const Case& c : cases) {
    v1::AttentionRequest request = good;
    c.mutate(&request);
    const grpc::Status status = call(request);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.needle)) << c.name;
  }
  // The server still serves after all of that.
  EXPECT_TRUE(call(good).ok());

  v1::AdditiveAttentionRequest named;
  named.set_weights_name("mlp-1");
  grpc::ClientContext context;
  v1::AdditiveAttentionResponse response;
  // No repository in this server: named weights cannot be found.
  EXPECT_EQ(stub_->AdditiveAttention(&context, named, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// A second typed service over the fixture's core, with a catalogue over a
// model repository of its own (a fresh folder, removed at the end) and a
// loopback server of its own.
class WithModels {
 public:
  explicit WithModels(CallRunner* calls) {
    char pattern[] = "/tmp/attnserve-typed-XXXXXX";
    EXPECT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    repository_ = LoadModelRepository(dir_).value();
    catalogue_ = std::make_unique<ModelCatalogue>(repository_.get());
    service_ = std::make_unique<AttentionService>(calls, catalogue_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port),
        grpc::InsecureChannelCredentials()));
  }
  ~WithModels() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
    }
    EXPECT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }

  ModelRepository& repository() { return *repository_; }
  v1::AttentionService::Stub* stub() { return stub_.get(); }

 private:
  std::string dir_;
  std::unique_ptr<ModelRepository> repository_;
  std::unique_ptr<ModelCatalogue> catalogue_;
  std::unique_ptr<AttentionService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

// A call that names a stored model's weights (weights_name) is that
// model's inference: it counts in the model's statistics, as the same call
// through KServe does; inline weights count under no model, and an unknown
// model under rpc="unresolved", as in KServe. (Before the
// models layer the typed API never set the call's model.)
TEST_P(ServiceTest, NamedWeightsCountInTheModelsStatistics) {
  WithModels models(&core_->calls());
  std::mt19937 rng(7);
  const v1::Tensor w_q = RandomTensor(rng, {4, 2});
  const v1::Tensor w_k = RandomTensor(rng, {4, 2});
  const v1::Tensor w_v = RandomTensor(rng, {4});
  RepositoryModel stored;
  stored.config.set_name("mlp-stored");
  stored.config.set_backend(AdditiveAttentionKind().backend);
  stored.tensors["W_q"] = ToTensor(w_q);
  stored.tensors["W_k"] = ToTensor(w_k);
  stored.tensors["w_v"] = ToTensor(w_v);
  ASSERT_TRUE(models.repository()
                  .SaveModel({"test", "additive weights"}, "mlp-stored",
                              std::move(stored))
                  .ok());
  v1::AttentionService::Stub* stub = models.stub();

  v1::AdditiveAttentionRequest inline_weights;
  *inline_weights.mutable_queries() = RandomTensor(rng, {1, 2, 2});
  *inline_weights.mutable_keys() = RandomTensor(rng, {1, 3, 2});
  *inline_weights.mutable_values() = RandomTensor(rng, {1, 3, 4});
  v1::AdditiveAttentionRequest named = inline_weights;
  named.set_weights_name("mlp-stored");
  *inline_weights.mutable_weights()->mutable_w_q() = w_q;
  *inline_weights.mutable_weights()->mutable_w_k() = w_k;
  *inline_weights.mutable_weights()->mutable_w_v() = w_v;
  v1::AdditiveAttentionRequest missing = named;
  missing.set_weights_name("absent");

  auto call = [&](const v1::AdditiveAttentionRequest& request,
                  v1::AdditiveAttentionResponse* response) {
    grpc::ClientContext context;
    return stub->AdditiveAttention(&context, request, response);
  };
  v1::AdditiveAttentionResponse by_name, by_value, none;
  ASSERT_TRUE(call(named, &by_name).ok());
  ASSERT_TRUE(call(named, &by_name).ok());
  ASSERT_TRUE(call(inline_weights, &by_value).ok());
  EXPECT_EQ(call(missing, &none).error_code(), grpc::StatusCode::NOT_FOUND);
  // The same weights, stored or sent, give the same answer.
  EXPECT_EQ(ToTensor(by_name.output()).data, ToTensor(by_value.output()).data);

  const ModelStatistics::Counts counts =
      core_->calls().statistics().Get("mlp-stored");
  EXPECT_EQ(counts.success_count, 2u);
  EXPECT_EQ(counts.fail_count, 0u);
  EXPECT_EQ(core_->calls().statistics().Get("absent").fail_count, 0u);
  // An unknown model is counted as KServe counts one: unresolved, not under
  // the operation (the call was never handed over).
  EXPECT_EQ(CounterSum("attnserve_requests_total",
                       {{"rpc", "unresolved"}, {"code", "NOT_FOUND"}}),
            1);
  EXPECT_EQ(CounterSum("attnserve_requests_total",
                       {{"rpc", "AdditiveAttention"}, {"code", "NOT_FOUND"}}),
            0);
}

// A memory stored as BF16 (its keys and values bfloat16 in the file) is
// computed in bfloat16 without converting it: within the reference's bound
// for the same queries against the rounded values at bfloat16 precision,
// with the call's default precision, and so is it grown by an append (in
// pieces, merged); float16 is refused, naming the field.
TEST_P(ServiceTest, QueriesAgainstABFloat16Memory) {
  WithModels models(&core_->calls());
  std::mt19937 rng(10);
  const int64_t n = 33, d = 8, dv = 3;
  attn::Tensor keys = ToTensor(RandomTensor(rng, {n, d}));
  attn::Tensor values = ToTensor(RandomTensor(rng, {n, dv}));
  RepositoryModel memory;
  memory.config.set_name("memory16");
  memory.config.set_backend(AttentionMemoryKind().backend);
  for (auto [name, tensor] : {std::pair<const char*, attn::Tensor*>{"keys", &keys},
                              {"values", &values}}) {
    auto bits = std::make_shared<std::vector<uint16_t>>(tensor->data.size());
    for (size_t i = 0; i < bits->size(); ++i) {
      (*bits)[i] = attn::BFloat16Bits(tensor->data[i]);
      tensor->data[i] = attn::RoundToBFloat16(tensor->data[i]);
    }
    const uint16_t* data = bits->data();
    memory.tensors[name] = StoredTensor(tensor->shape, data, std::move(bits));
  }
  ASSERT_TRUE(models.repository()
                  .SaveModel({"test", "a memory"}, "memory16", std::move(memory))
                  .ok());
  ASSERT_TRUE(models.repository().Find("memory16")->tensors.at("keys").is_bfloat16());
  v1::AttentionService::Stub* stub = models.stub();
  v1::AttentionRequest request;
  request.set_memory_name("memory16");
  *request.mutable_queries() = RandomTensor(rng, {2, 5, d});
  v1::AttentionResponse response;
  {
    grpc::ClientContext context;
    const grpc::Status status =
        stub->ScaledDotProductAttention(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const attn::Tensor repeated_keys = attn::testing::RepeatAsBatch(keys, 2);
  const attn::Tensor repeated_values = attn::testing::RepeatAsBatch(values, 2);
  const attn::Tensor queries = ToTensor(request.queries());
  attn::AttentionRequest plain;
  plain.queries = View(queries);
  plain.keys = View(repeated_keys);
  plain.values = View(repeated_values);
  plain.precision = attn::Precision::kBFloat16;
  plain.return_weights = true;
  const attn::OpResult exact =
      reference_->ScaledDotProductAttention(plain).value();
  EXPECT_TRUE(attn::testing::WithinBounds(
      ToTensor(response.output()), exact.output,
      attn::testing::AttentionBounds(plain, exact).output));

  // Grown by an append, it is served in two pieces of bfloat16 bits, each
  // attended alone and merged: within the merge's bound of the reference
  // over every row, weights included.
  v1::AppendMemoryRequest more;
  more.set_name("memory16");
  *more.mutable_keys() = RandomTensor(rng, {7, d});
  *more.mutable_values() = RandomTensor(rng, {7, dv});
  {
    grpc::ClientContext context;
    v1::AppendMemoryResponse appended;
    const grpc::Status status = stub->AppendMemory(&context, more, &appended);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_EQ(
      models.repository().Find("memory16")->tensors.at("keys").pieces.size(),
      2u);
  // The memory's rows as the reference sees them: rounded, per piece.
  std::vector<std::pair<attn::Tensor, attn::Tensor>> pieces = {{keys, values}};
  pieces.emplace_back(ToTensor(more.keys()), ToTensor(more.values()));
  for (attn::Tensor* tensor : {&pieces[1].first, &pieces[1].second}) {
    for (float& value : tensor->data) value = attn::RoundToBFloat16(value);
  }
  attn::Tensor all_keys = attn::Tensor::Zeros({n + 7, d});
  attn::Tensor all_values = attn::Tensor::Zeros({n + 7, dv});
  std::copy(keys.data.begin(), keys.data.end(), all_keys.data.begin());
  std::copy(pieces[1].first.data.begin(), pieces[1].first.data.end(),
            all_keys.data.begin() + n * d);
  std::copy(values.data.begin(), values.data.end(), all_values.data.begin());
  std::copy(pieces[1].second.data.begin(), pieces[1].second.data.end(),
            all_values.data.begin() + n * dv);
  request.set_return_weights(true);
  {
    grpc::ClientContext context;
    const grpc::Status status =
        stub->ScaledDotProductAttention(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const attn::Tensor grown_keys = attn::testing::RepeatAsBatch(all_keys, 2);
  const attn::Tensor grown_values = attn::testing::RepeatAsBatch(all_values, 2);
  attn::AttentionRequest whole = plain;
  whole.keys = View(grown_keys);
  whole.values = View(grown_values);
  const attn::OpResult grown_exact =
      reference_->ScaledDotProductAttention(whole).value();
  const attn::testing::ErrorBounds grown_bounds =
      attn::testing::AttentionBounds(whole, grown_exact,
                                     PieceError(*reference_, plain, pieces, 2));
  EXPECT_TRUE(attn::testing::WithinBounds(
      ToTensor(response.output()), grown_exact.output, grown_bounds.output));
  EXPECT_EQ(ToTensor(response.weights()).shape, (attn::Shape{2, 5, n + 7}));
  EXPECT_TRUE(attn::testing::WithinBounds(
      ToTensor(response.weights()), grown_exact.weights, grown_bounds.weights));
  request.set_return_weights(false);

  request.set_precision(v1::PRECISION_FLOAT16);
  grpc::ClientContext context;
  const grpc::Status refused =
      stub->ScaledDotProductAttention(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("precision: memory 'memory16' holds bfloat16 keys"));
}

// ScaledDotProductAttention with memory_name: the stored memory's keys,
// values, score and scale answer the queries alone (within the reference's
// bound of the same queries against the memory repeated per batch entry);
// what the memory holds may not be sent beside it; an unknown memory is
// NOT_FOUND.
TEST_P(ServiceTest, QueriesAgainstAStoredMemory) {
  WithModels models(&core_->calls());
  std::mt19937 rng(9);
  const int64_t n = 17, d = 4, dv = 2;
  RepositoryModel memory;
  memory.config.set_name("memory");
  memory.config.set_backend(AttentionMemoryKind().backend);
  const attn::Tensor keys = ToTensor(RandomTensor(rng, {n, d}));
  const attn::Tensor values = ToTensor(RandomTensor(rng, {n, dv}));
  memory.tensors["keys"] = keys;
  memory.tensors["values"] = values;
  ASSERT_TRUE(models.repository()
                  .SaveModel({"test", "a memory"}, "memory", std::move(memory))
                  .ok());
  v1::AttentionService::Stub* stub = models.stub();
  auto call = [&](const v1::AttentionRequest& request,
                  v1::AttentionResponse* response) {
    grpc::ClientContext context;
    return stub->ScaledDotProductAttention(&context, request, response);
  };

  v1::AttentionRequest request;
  request.set_memory_name("memory");
  *request.mutable_queries() = RandomTensor(rng, {3, 2, d});
  request.set_return_weights(true);
  v1::AttentionResponse response;
  const grpc::Status status = call(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const attn::Tensor repeated_keys =
      attn::testing::RepeatAsBatch(keys, 3);
  const attn::Tensor repeated_values =
      attn::testing::RepeatAsBatch(values, 3);
  const attn::Tensor queries = ToTensor(request.queries());
  attn::AttentionRequest plain;
  plain.queries = View(queries);
  plain.keys = View(repeated_keys);
  plain.values = View(repeated_values);
  plain.return_weights = true;
  const attn::OpResult exact =
      reference_->ScaledDotProductAttention(plain).value();
  const attn::testing::ErrorBounds bounds =
      attn::testing::AttentionBounds(plain, exact);
  EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.output()),
                                          exact.output, bounds.output));
  EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.weights()),
                                          exact.weights, bounds.weights));

  v1::AttentionRequest with_keys = request;
  *with_keys.mutable_keys() = RandomTensor(rng, {3, n, d});
  EXPECT_THAT(call(with_keys, &response).error_message(),
              HasSubstr("keys: model 'memory' holds the keys and values"));
  v1::AttentionRequest causal = request;
  causal.set_causal(true);
  EXPECT_EQ(call(causal, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::AttentionRequest wrong_d = request;
  *wrong_d.mutable_queries() = RandomTensor(rng, {3, 2, d + 1});
  const grpc::Status wrong_d_status = call(wrong_d, &response);
  EXPECT_EQ(wrong_d_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(wrong_d_status.error_message(),
              HasSubstr("queries: shape (3, 2, 5) must be (B, Lq, 4)"));
  EXPECT_THAT(wrong_d_status.error_message(),
              HasSubstr("model 'memory' holds keys ("));
  v1::AttentionRequest unknown = request;
  unknown.set_memory_name("absent");
  EXPECT_EQ(call(unknown, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(core_->calls().statistics().Get("memory").success_count, 1u);
}

// AppendMemory (issue #47): the first append makes the memory, later ones
// grow it, and every query after an answer sees all the rows appended so
// far, within the reference's bound over them, weights over every row
// included. Bad appends are refused naming the field and change nothing.
TEST_P(ServiceTest, AppendedRowsAreServedAtOnce) {
  WithModels models(&core_->calls());
  std::mt19937 rng(47);
  const int64_t d = 4, dv = 2;
  v1::AttentionService::Stub* stub = models.stub();
  auto append = [&](const v1::AppendMemoryRequest& request,
                    v1::AppendMemoryResponse* response) {
    grpc::ClientContext context;
    return stub->AppendMemory(&context, request, response);
  };
  std::vector<float> all_keys, all_values;
  v1::AttentionRequest query;
  query.set_memory_name("grown");
  *query.mutable_queries() = RandomTensor(rng, {2, 3, d});
  query.set_return_weights(true);
  int64_t rows = 0;
  for (const int64_t n : {5, 7, 1}) {
    SCOPED_TRACE(n);
    v1::AppendMemoryRequest request;
    request.set_name("grown");
    *request.mutable_keys() = RandomTensor(rng, {n, d});
    *request.mutable_values() = RandomTensor(rng, {n, dv});
    if (rows == 0) request.mutable_create()->set_scale(0.7f);
    v1::AppendMemoryResponse response;
    const grpc::Status status = append(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.first_row(), rows);
    rows += n;
    EXPECT_EQ(response.rows(), rows);
    const attn::Tensor keys = ToTensor(request.keys());
    const attn::Tensor values = ToTensor(request.values());
    all_keys.insert(all_keys.end(), keys.data.begin(), keys.data.end());
    all_values.insert(all_values.end(), values.data.begin(), values.data.end());

    v1::AttentionResponse answer;
    grpc::ClientContext context;
    const grpc::Status queried =
        stub->ScaledDotProductAttention(&context, query, &answer);
    ASSERT_TRUE(queried.ok()) << queried.error_message();
    attn::Tensor memory_keys = attn::Tensor::Zeros({rows, d});
    memory_keys.data.assign(all_keys.begin(), all_keys.end());
    attn::Tensor memory_values = attn::Tensor::Zeros({rows, dv});
    memory_values.data.assign(all_values.begin(), all_values.end());
    const attn::Tensor repeated_keys =
        attn::testing::RepeatAsBatch(memory_keys, 2);
    const attn::Tensor repeated_values =
        attn::testing::RepeatAsBatch(memory_values, 2);
    const attn::Tensor queries = ToTensor(query.queries());
    attn::AttentionRequest plain;
    plain.queries = View(queries);
    plain.keys = View(repeated_keys);
    plain.values = View(repeated_values);
    plain.scale = 0.7f;
    plain.return_weights = true;
    const attn::OpResult exact =
        reference_->ScaledDotProductAttention(plain).value();
    // Grown, the memory is held in two pieces, its first append's rows and
    // those since, merged by log-sum-exp: the bound holds the pieces'.
    std::vector<std::pair<attn::Tensor, attn::Tensor>> pieces;
    const int64_t base = 5;
    for (const auto& [first, count] :
         {std::pair<int64_t, int64_t>{0, base}, {base, rows - base}}) {
      if (count == 0) continue;
      auto& [piece_keys, piece_values] = pieces.emplace_back(
          attn::Tensor::Zeros({count, d}), attn::Tensor::Zeros({count, dv}));
      std::copy(all_keys.begin() + first * d,
                all_keys.begin() + (first + count) * d, piece_keys.data.begin());
      std::copy(all_values.begin() + first * dv,
                all_values.begin() + (first + count) * dv,
                piece_values.data.begin());
    }
    // (One piece, before the first append after creation: no merge.)
    const double piece_error =
        pieces.size() > 1 ? PieceError(*reference_, plain, pieces, 2) : 0.0;
    const attn::testing::ErrorBounds bounds =
        attn::testing::AttentionBounds(plain, exact, piece_error);
    EXPECT_EQ(ToTensor(answer.weights()).shape, (attn::Shape{2, 3, rows}));
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(answer.output()),
                                            exact.output, bounds.output));
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(answer.weights()),
                                            exact.weights, bounds.weights));
  }

  v1::AppendMemoryRequest good;
  good.set_name("grown");
  *good.mutable_keys() = RandomTensor(rng, {2, d});
  *good.mutable_values() = RandomTensor(rng, {2, dv});
  v1::AppendMemoryResponse response;
  v1::AppendMemoryRequest nan = good;
  nan.mutable_values()->set_values(3, std::nanf(""));
  v1::AppendMemoryRequest wrong_d = good;
  *wrong_d.mutable_keys() = RandomTensor(rng, {2, d + 1});
  v1::AppendMemoryRequest half = good;
  half.mutable_create()->set_precision(v1::PRECISION_FLOAT16);
  v1::AppendMemoryRequest other_scale = good;
  other_scale.mutable_create()->set_scale(0.5f);
  v1::AppendMemoryRequest absent = good;
  absent.set_name("absent");
  for (const auto& [request, code, message] :
       {std::tuple<const v1::AppendMemoryRequest&, grpc::StatusCode,
                   const char*>{nan, grpc::StatusCode::INVALID_ARGUMENT,
                                "values"},
        {wrong_d, grpc::StatusCode::INVALID_ARGUMENT,
         "keys: shape (2, 5) must be (n, 4): model 'grown' holds keys (13, 4)"},
        {half, grpc::StatusCode::INVALID_ARGUMENT, "create.precision"},
        {other_scale, grpc::StatusCode::INVALID_ARGUMENT,
         "create: memory 'grown' exists with score dot_product, scale 0.7"},
        {absent, grpc::StatusCode::NOT_FOUND, "name: no model 'absent'"}}) {
    const grpc::Status status = append(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }
  EXPECT_EQ(models.repository().Find("grown")->tensors.at("keys").shape,
            (attn::Shape{rows, d}));
}

// FitBandwidth's save_as stores the fit with its training set, and
// NadarayaWatson naming it (model_name) answers x_query alone, as the
// textbook's net(x_test, keys, values): within the reference's bound over
// the training set with the fitted bandwidth. What the model holds may not
// be sent beside it; a model holding a bandwidth only takes the training
// set (and kernel) from the call; an unknown model is NOT_FOUND.
// FitBandwidth with model_name (issue #47): the fit runs on the stored
// model's training set as it has grown, equals the fit of the same points
// sent inline, and its bandwidth replaces the model's, written whole with
// the rows it holds. What the model holds may not be sent beside it; a
// bandwidth alone has no set to fit on; an unknown model is NOT_FOUND.
TEST_P(ServiceTest, ARefitRunsOnTheStoredTrainingSet) {
  WithModels models(&core_->calls());
  v1::AttentionService::Stub* stub = models.stub();
  std::mt19937 rng(47);
  auto fit = [&](const v1::FitBandwidthRequest& request,
                 v1::FitBandwidthResponse* response) {
    grpc::ClientContext context;
    return stub->FitBandwidth(&context, request, response);
  };
  const v1::Tensor first_x = RandomTensor(rng, {20});
  const v1::Tensor first_y = RandomTensor(rng, {20});
  v1::FitBandwidthRequest save;
  *save.mutable_x_train() = first_x;
  *save.mutable_y_train() = first_y;
  save.set_save_as("grown_net");
  v1::FitBandwidthResponse response;
  ASSERT_TRUE(fit(save, &response).ok());
  v1::AppendMemoryRequest more;
  more.set_name("grown_net");
  *more.mutable_keys() = RandomTensor(rng, {15});
  *more.mutable_values() = RandomTensor(rng, {15});
  v1::AppendMemoryResponse appended;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->AppendMemory(&context, more, &appended).ok());
  }
  v1::FitBandwidthRequest refit;
  refit.set_model_name("grown_net");
  refit.set_epochs(3);
  v1::FitBandwidthResponse refitted;
  const grpc::Status status = fit(refit, &refitted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  v1::FitBandwidthRequest inline_fit;
  inline_fit.set_epochs(3);
  for (const auto& [whole, part1, part2] :
       {std::tuple<v1::Tensor*, const v1::Tensor&, const v1::Tensor&>{
            inline_fit.mutable_x_train(), first_x, more.keys()},
        {inline_fit.mutable_y_train(), first_y, more.values()}}) {
    whole->add_shape(35);
    for (const v1::Tensor* part : {&part1, &part2}) {
      const attn::Tensor values = ToTensor(*part);
      for (float value : values.data) whole->add_values(value);
    }
  }
  v1::FitBandwidthResponse inline_fitted;
  ASSERT_TRUE(fit(inline_fit, &inline_fitted).ok());
  EXPECT_FLOAT_EQ(refitted.bandwidth(), inline_fitted.bandwidth());
  EXPECT_NE(refitted.bandwidth(), response.bandwidth());
  std::shared_ptr<const RepositoryModel> stored =
      models.repository().Find("grown_net");
  EXPECT_EQ(stored->tensors.at("bandwidth").data[0], refitted.bandwidth());
  EXPECT_EQ(stored->tensors.at("x_train").shape, attn::Shape{35});
  EXPECT_EQ(stored->appended_files, 0);  // written whole

  v1::FitBandwidthRequest with_set = refit;
  *with_set.mutable_x_train() = first_x;
  v1::FitBandwidthRequest unknown = refit;
  unknown.set_model_name("absent");
  ASSERT_TRUE(models.repository()
                  .SaveModel({"test", "a fit"}, "bandwidth_only",
                             FittedNadarayaWatsonModel("bandwidth_only", 1.0f))
                  .ok());
  v1::FitBandwidthRequest no_set = refit;
  no_set.set_model_name("bandwidth_only");
  for (const auto& [request, code, message] :
       {std::tuple<const v1::FitBandwidthRequest&, grpc::StatusCode,
                   const char*>{with_set, grpc::StatusCode::INVALID_ARGUMENT,
                                "x_train: leave it unset with model_name"},
        {unknown, grpc::StatusCode::NOT_FOUND, "model_name: no nadaraya_watson"},
        {no_set, grpc::StatusCode::INVALID_ARGUMENT,
         "holds a bandwidth only, no training set to fit on"}}) {
    const grpc::Status refused = fit(request, &response);
    EXPECT_EQ(refused.error_code(), code) << refused.error_message();
    EXPECT_THAT(refused.error_message(), HasSubstr(message));
  }
}

TEST_P(ServiceTest, AFittedModelAnswersQueriesAlone) {
  WithModels models(&core_->calls());
  v1::AttentionService::Stub* stub = models.stub();
  std::mt19937 rng(10);
  const v1::Tensor x_train = RandomTensor(rng, {30});
  const v1::Tensor y_train = RandomTensor(rng, {30});
  v1::FitBandwidthRequest fit;
  *fit.mutable_x_train() = x_train;
  *fit.mutable_y_train() = y_train;
  fit.set_save_as("net");
  v1::FitBandwidthResponse fitted;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub->FitBandwidth(&context, fit, &fitted);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  auto call = [&](const v1::NadarayaWatsonRequest& request,
                  v1::NadarayaWatsonResponse* response) {
    grpc::ClientContext context;
    return stub->NadarayaWatson(&context, request, response);
  };
  auto expect_reference = [&](const v1::NadarayaWatsonResponse& response,
                              const v1::Tensor& x, const v1::Tensor& y,
                              const v1::Tensor& queries,
                              attn::RegressionKernel kernel, float bandwidth) {
    const attn::Tensor xt = ToTensor(x), yt = ToTensor(y), qt = ToTensor(queries);
    attn::NadarayaWatsonRequest plain{View(xt), View(yt), View(qt), kernel,
                                      bandwidth, true};
    const attn::OpResult exact = reference_->NadarayaWatson(plain).value();
    const attn::testing::ErrorBounds bounds =
        attn::testing::NadarayaWatsonBounds(plain, exact);
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.output()),
                                            exact.output, bounds.output));
    EXPECT_TRUE(attn::testing::WithinBounds(ToTensor(response.weights()),
                                            exact.weights, bounds.weights));
  };

  v1::NadarayaWatsonRequest request;
  request.set_model_name("net");
  *request.mutable_x_query() = RandomTensor(rng, {7});
  request.set_return_weights(true);
  v1::NadarayaWatsonResponse response;
  const grpc::Status status = call(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  expect_reference(response, x_train, y_train, request.x_query(),
                   attn::RegressionKernel::kGaussian, fitted.bandwidth());

  v1::NadarayaWatsonRequest with_set = request;
  *with_set.mutable_x_train() = x_train;
  EXPECT_THAT(call(with_set, &response).error_message(),
              HasSubstr("x_train: model 'net' holds its training set; leave "
                        "x_train unset with model_name"));
  v1::NadarayaWatsonRequest with_bandwidth = request;
  with_bandwidth.set_bandwidth(2.0f);
  EXPECT_THAT(call(with_bandwidth, &response).error_message(),
              HasSubstr("bandwidth: model 'net' holds its fitted bandwidth"));
  v1::NadarayaWatsonRequest boxcar = request;
  boxcar.set_kernel(v1::REGRESSION_KERNEL_BOXCAR);
  EXPECT_THAT(call(boxcar, &response).error_message(),
              HasSubstr("model 'net' serves its own kernel, gaussian"));
  v1::NadarayaWatsonRequest unknown = request;
  unknown.set_model_name("absent");
  EXPECT_EQ(call(unknown, &response).error_code(), grpc::StatusCode::NOT_FOUND);

  ASSERT_TRUE(models.repository()
                  .SaveModel({"test", "a bandwidth"}, "bandwidth_only",
                             FittedNadarayaWatsonModel("bandwidth_only", 0.8f))
                  .ok());
  v1::NadarayaWatsonRequest bandwidth_only = request;
  bandwidth_only.set_model_name("bandwidth_only");
  bandwidth_only.set_kernel(v1::REGRESSION_KERNEL_EPANECHNIKOV);
  *bandwidth_only.mutable_x_train() = x_train;
  *bandwidth_only.mutable_y_train() = y_train;
  ASSERT_TRUE(call(bandwidth_only, &response).ok());
  expect_reference(response, x_train, y_train, request.x_query(),
                   attn::RegressionKernel::kEpanechnikov, 0.8f);
  bandwidth_only.clear_x_train();
  EXPECT_EQ(call(bandwidth_only, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(core_->calls().statistics().Get("net").success_count, 1u);
}

// A small request whose result could not be sent is refused before the
// result is allocated or computed (fuzz/typed_request: a 370 KB BatchMatmul
// once made an 8.5 GB product first). Both RPCs whose output can outgrow
// the request by far, and attention whose weights can.
TEST_P(ServiceTest, PriorityAndTimeoutMetadata) {
  std::mt19937 rng(4);
  v1::AttentionRequest request;
  *request.mutable_queries() = RandomTensor(rng, {2, 1, 2});
  *request.mutable_keys() = RandomTensor(rng, {2, 10, 2});
  *request.mutable_values() = RandomTensor(rng, {2, 10, 4});
  {
    grpc::ClientContext context;
    context.AddMetadata("attnserve-priority", "1");
    context.AddMetadata("attnserve-timeout-us", "10000000");
    v1::AttentionResponse response;
    EXPECT_TRUE(stub_->ScaledDotProductAttention(&context, request, &response).ok());
    EXPECT_EQ(response.output().shape_size(), 3);
  }
  for (const char* key : {"attnserve-priority", "attnserve-timeout-us"}) {
    grpc::ClientContext context;
    context.AddMetadata(key, "soon");
    v1::AttentionResponse response;
    const grpc::Status status =
        stub_->ScaledDotProductAttention(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << key;
    EXPECT_NE(status.error_message().find(key), std::string::npos)
        << status.error_message();
  }
  grpc::ClientContext context;
  context.AddMetadata("attnserve-priority", "-2");
  v1::BatchMatmulRequest matmul;
  *matmul.mutable_a() = RandomTensor(rng, {1, 2, 3});
  *matmul.mutable_b() = RandomTensor(rng, {1, 3, 2});
  v1::BatchMatmulResponse matmul_response;
  EXPECT_EQ(stub_->BatchMatmul(&context, matmul, &matmul_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_P(ServiceTest, ResultOverTheResponseLimitIsNeverComputed) {
  std::mt19937 rng(31);
  const double runs_before = CounterSum("attnserve_kernel_runs_total", {});
  v1::BatchMatmulRequest matmul;
  *matmul.mutable_a() = RandomTensor(rng, {1, 1100, 1});
  *matmul.mutable_b() = RandomTensor(rng, {1, 1, 1100});
  grpc::ClientContext matmul_context;
  v1::BatchMatmulResponse matmul_response;
  const grpc::Status matmul_status =
      stub_->BatchMatmul(&matmul_context, matmul, &matmul_response);
  EXPECT_EQ(matmul_status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(matmul_status.error_message(),
              HasSubstr("output (1, 1100, 1100)"));
  EXPECT_THAT(matmul_status.error_message(), HasSubstr("not computed"));

  v1::AttentionRequest attention;
  *attention.mutable_queries() = RandomTensor(rng, {1, 1100, 2});
  *attention.mutable_keys() = RandomTensor(rng, {1, 1100, 2});
  *attention.mutable_values() = RandomTensor(rng, {1, 1100, 2});
  attention.set_return_weights(true);
  grpc::ClientContext attention_context;
  v1::AttentionResponse attention_response;
  const grpc::Status attention_status = stub_->ScaledDotProductAttention(
      &attention_context, attention, &attention_response);
  EXPECT_EQ(attention_status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(attention_status.error_message(),
              HasSubstr("weights (1, 1100, 1100)"));
  EXPECT_EQ(CounterSum("attnserve_kernel_runs_total", {}), runs_before);

  // Without the weights the same request fits, and is answered.
  attention.set_return_weights(false);
  grpc::ClientContext again;
  EXPECT_TRUE(
      stub_->ScaledDotProductAttention(&again, attention, &attention_response)
          .ok());
}

// Many clients at once, with ragged shapes: every response is its own
// request's answer (the batcher never mixes up or loses a request).
TEST_P(ServiceTest, ConcurrentClientsEachGetTheirOwnResult) {
  constexpr int kClients = 12;
  constexpr int kCallsEach = 15;
  std::vector<std::thread> clients;
  std::atomic<int> mismatches{0}, failures{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(100 + c);
      std::uniform_int_distribution<int64_t> length(1, 48);
      for (int i = 0; i < kCallsEach; ++i) {
        const int64_t lq = length(rng), lk = length(rng);
        v1::AttentionRequest request;
        *request.mutable_queries() = RandomTensor(rng, {1, lq, 16});
        *request.mutable_keys() = RandomTensor(rng, {1, lk, 16}, i % 2 == 0);
        *request.mutable_values() = RandomTensor(rng, {1, lk, 8});
        request.mutable_valid_lens()->add_shape(1);
        request.mutable_valid_lens()->add_values(
            static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, lk)(rng)));
        request.set_return_weights(i % 3 == 0);
        grpc::ClientContext context;
        v1::AttentionResponse response;
        if (!stub_->ScaledDotProductAttention(&context, request, &response).ok()) {
          ++failures;
          continue;
        }
        const attn::Tensor q = ToTensor(request.queries()),
                           k = ToTensor(request.keys()),
                           v = ToTensor(request.values());
        attn::AttentionRequest op;
        op.queries = View(q);
        op.keys = View(k);
        op.values = View(v);
        op.valid_lens = {request.valid_lens().values().data(), {1}};
        op.return_weights = true;  // the bounds need the exact weights
        const attn::OpResult expected =
            reference_->ScaledDotProductAttention(op).value();
        const attn::testing::ErrorBounds bounds =
            attn::testing::AttentionBounds(op, expected);
        if (!attn::testing::WithinBounds(ToTensor(response.output()),
                                         expected.output, bounds.output) ||
            (request.return_weights() &&
             !attn::testing::WithinBounds(ToTensor(response.weights()),
                                          expected.weights, bounds.weights))) {
          ++mismatches;
        }
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  if (GetParam()) {
    // Batching was on: some calls shared a batch (mean batch size > 1).
    double batches = 0, requests = 0;
    for (const prometheus::MetricFamily& f : core_->metrics().registry()->Collect()) {
      if (f.name != "attnserve_batch_size") continue;
      for (const prometheus::ClientMetric& metric : f.metric) {
        batches += metric.histogram.sample_count;
        requests += metric.histogram.sample_sum;
      }
    }
    EXPECT_EQ(requests, kClients * kCallsEach);
    EXPECT_GT(requests, batches);
  }
}

INSTANTIATE_TEST_SUITE_P(Batching, ServiceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "On" : "Off";
                         });

// The worker pool's own queue (batching off): a full queue answers
// RESOURCE_EXHAUSTED at once; a call whose deadline passes while it waits is
// never computed.
// A call through the core whose work holds a worker until `release`.
class BlockingCall : public CallResponder {
 public:
  BlockingCall(CallRunner* calls, absl::Notification* release)
      : release_(release) {
    calls->Run(
        Operation::kMaskedSoftmax, CallContext{},
        [release](ElementBudget*) -> absl::StatusOr<CallRunner::Work> {
          return CallRunner::Work([release]() -> absl::StatusOr<std::string> {
            release->WaitForNotification();
            return std::string("blocker");
          });
        },
        this);
  }
  // Releases the worker if the test has not (a failed assertion).
  ~BlockingCall() override {
    if (!release_->HasBeenNotified()) release_->Notify();
    answered_.WaitForNotification();
  }
  absl::Status Computed(const CallRecord&) override { return absl::OkStatus(); }
  void Answer(const absl::Status&, const CallRecord&, Admission::Ticket) override {
    answered_.Notify();
  }

 private:
  absl::Notification* const release_;
  absl::Notification answered_;
};

class PoolQueueTest : public ServiceTest {
 protected:
  void SetUp() override {}
};

TEST_F(PoolQueueTest, QueueFullAndDeadlineInQueue) {
  Start(/*threads=*/1, /*max_queue=*/1, /*batching=*/false);
  absl::Notification release;
  BlockingCall blocker(&core_->calls(), &release);
  // The worker is busy: wait until it has taken the blocker off the queue.
  while (core_->queue_depth() != 0) std::this_thread::yield();

  std::mt19937 rng(3);
  v1::AttentionRequest request;
  *request.mutable_queries() = RandomTensor(rng, {1, 2, 4});
  *request.mutable_keys() = RandomTensor(rng, {1, 3, 4});
  *request.mutable_values() = RandomTensor(rng, {1, 3, 4});

  // This one takes the only queue slot, with a deadline that will pass.
  grpc::ClientContext late_context;
  late_context.set_deadline(std::chrono::system_clock::now() +
                            std::chrono::milliseconds(200));
  v1::AttentionResponse late_response;
  grpc::Status late_status;
  absl::Notification late_done;
  stub_->async()->ScaledDotProductAttention(
      &late_context, &request, &late_response, [&](grpc::Status status) {
        late_status = std::move(status);
        late_done.Notify();
      });
  while (core_->queue_depth() != 1) std::this_thread::yield();

  grpc::ClientContext full_context;
  v1::AttentionResponse full_response;
  const grpc::Status full =
      stub_->ScaledDotProductAttention(&full_context, request, &full_response);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("queue is full"));

  late_done.WaitForNotification();
  EXPECT_EQ(late_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server's deadline is its receive time plus the remaining timeout,
  // so it can trail the client's by the loopback latency: let it pass too
  // before the worker is released.
  const auto server_deadline_passed =
      late_context.deadline() + std::chrono::milliseconds(50);
  while (std::chrono::system_clock::now() < server_deadline_passed) {
    std::this_thread::yield();
  }
  release.Notify();
  // Let the worker reach the expired call, then check it was not computed.
  while (core_->queue_depth() != 0) std::this_thread::yield();
  core_->Shutdown();
  EXPECT_EQ(CounterSum("attnserve_kernel_runs_total",
                       {{"rpc", "ScaledDotProductAttention"}}),
            0.0);
  EXPECT_EQ(CounterSum("attnserve_requests_total",
                       {{"rpc", "ScaledDotProductAttention"},
                        {"code", "RESOURCE_EXHAUSTED"}}),
            1.0);
}

}  // namespace
}  // namespace attnserve
