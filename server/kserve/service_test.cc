// KServe's front ends in process, over the production assembly
// (server/execution/execution_stack.h) and a catalogue: what the Python suites
// (tests/kserve/) cannot see from outside.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "attn/engine.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/error_bounds.h"
#include "attn/testing/random.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "prometheus/metric_family.h"
#include "server/execution/execution_stack.h"
#include "server/kserve/inference_service.h"
#include "server/kserve/rest_service.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/models/model_catalogue.h"
#include "server/models/model_kinds.h"
#include "server/repository/safetensors.h"

namespace attnserve {
namespace {

class KServeServiceTest : public ::testing::Test {
 protected:
  virtual ExecutionStack::Options StackOptions() const { return {}; }
  virtual ModelControl Control() const { return {}; }

  void SetUp() override {
    stack_ = ExecutionStack::Create(
                 StackOptions(),
                 attn::Engine::Create(attn::EngineOptions{}).value())
                 .value();
    char pattern[] = "/tmp/attnserve-kserve-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    repository_ = LoadModelRepository(dir_).value();
    catalogue_ = std::make_unique<ModelCatalogue>(repository_.get(), Control());
    kserve_ = std::make_unique<InferenceService>(stack_.get(), catalogue_.get(),
                                                 /*max_batch_size=*/32);
    rest_ = std::make_unique<KServeRestService>(stack_.get(), catalogue_.get(),
                                                /*max_batch_size=*/32);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(kserve_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port),
        grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    stack_->Shutdown();
    EXPECT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }

  // attnserve_requests_total's sample with exactly these labels.
  double Requests(const std::string& rpc, const std::string& code,
                  const std::string& protocol) {
    for (const prometheus::MetricFamily& family :
         stack_->metrics().registry()->Collect()) {
      if (family.name != "attnserve_requests_total") continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& label : metric.label) labels[label.name] = label.value;
        if (labels["rpc"] == rpc && labels["code"] == code &&
            labels["protocol"] == protocol) {
          return metric.counter.value;
        }
      }
    }
    ADD_FAILURE() << "no series rpc=" << rpc << " code=" << code;
    return -1;
  }

  // `tensor` as the request's input `name`, in typed FP32 contents.
  static void AddFloatInput(const std::string& name, const attn::Tensor& tensor,
                            inference::ModelInferRequest* request) {
    auto* input = request->add_inputs();
    input->set_name(name);
    input->set_datatype("FP32");
    for (int64_t dim : tensor.shape) input->add_shape(dim);
    for (float value : tensor.data) {
      input->mutable_contents()->add_fp32_contents(value);
    }
  }

  // Output `i` of a response with raw contents, as a tensor.
  static attn::Tensor OutputTensor(const inference::ModelInferResponse& response,
                                   int i) {
    attn::Tensor t;
    t.shape.assign(response.outputs(i).shape().begin(),
                   response.outputs(i).shape().end());
    t.data.resize(response.raw_output_contents(i).size() / sizeof(float));
    std::memcpy(t.data.data(), response.raw_output_contents(i).data(),
                response.raw_output_contents(i).size());
    return t;
  }

  // attnserve_batch_size_count for `rpc`: batches run.
  double Batches(const std::string& rpc) {
    for (const prometheus::MetricFamily& family :
         stack_->metrics().registry()->Collect()) {
      if (family.name != "attnserve_batch_size") continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const auto& label : metric.label) {
          if (label.name == "rpc" && label.value == rpc) {
            return static_cast<double>(metric.histogram.sample_count);
          }
        }
      }
    }
    ADD_FAILURE() << "no attnserve_batch_size series";
    return -1;
  }

  // Handles one REST call and returns its HTTP status.
  int Rest(const std::string& method, const std::string& path,
           const std::string& body) {
    class Responder : public RestResponder {
     public:
      void Reply(int http_status, std::string, RestBody,
                 Admission::Ticket) override {
        status = http_status;
        done.Notify();
      }
      int status = 0;
      absl::Notification done;
    } responder;
    RestCall call;
    call.method = method;
    call.path = path;
    call.body = body;
    call.peer = "test";
    rest_->Handle(call, &responder);
    responder.done.WaitForNotification();
    return responder.status;
  }

  std::string dir_;
  std::unique_ptr<ExecutionStack> stack_;
  std::unique_ptr<ModelRepository> repository_;
  std::unique_ptr<ModelCatalogue> catalogue_;
  std::unique_ptr<InferenceService> kserve_;
  std::unique_ptr<KServeRestService> rest_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

// Answers given before a model or operation is resolved are counted under
// rpc="unresolved" (a 12-minute soak once returned ~18.7k of them that
// /metrics never showed); a refused call of a resolved model under its
// operation.
TEST_F(KServeServiceTest, AnswersBeforeResolutionAreCounted) {
  inference::ModelInferRequest unknown;
  unknown.set_model_name("no_such_model");
  inference::ModelInferResponse response;
  {
    grpc::ClientContext context;
    EXPECT_EQ(stub_->ModelInfer(&context, unknown, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(Requests("unresolved", "NOT_FOUND", "grpc"), 1);

  inference::ModelInferRequest malformed;
  malformed.set_model_name("masked_softmax");
  malformed.add_inputs()->set_name("no_such_input");
  {
    grpc::ClientContext context;
    EXPECT_EQ(stub_->ModelInfer(&context, malformed, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(Requests("MaskedSoftmax", "INVALID_ARGUMENT", "grpc"), 1);

  EXPECT_EQ(Rest("POST", "/v2/models/no_such_model/infer",
                 R"({"inputs":[]})"),
            404);
  EXPECT_EQ(Requests("unresolved", "NOT_FOUND", "http"), 1);
  EXPECT_EQ(Rest("POST", "/v2/models/masked_softmax/infer", "not json"), 400);
  EXPECT_EQ(Rest("GET", "/no/such/route", ""), 404);
  EXPECT_EQ(Rest("GET", "/v2/models/masked_softmax/infer", ""), 405);
  EXPECT_EQ(Requests("unresolved", "NOT_FOUND", "http"), 2);
  EXPECT_EQ(Requests("unresolved", "INVALID_ARGUMENT", "http"), 2);
  // What is not an inference is not counted: health, metadata.
  EXPECT_EQ(Rest("GET", "/v2/health/ready", ""), 200);
  EXPECT_EQ(Requests("unresolved", "OK", "http"), 0);
}

// Readiness has one owner, the execution stack: its drain notice turns
// every front end's readiness off together.
TEST_F(KServeServiceTest, ReadinessFollowsTheStacksDrainNotice) {
  inference::ServerReadyRequest request;
  inference::ServerReadyResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ServerReady(&context, request, &response).ok());
  }
  EXPECT_TRUE(response.ready());
  EXPECT_EQ(Rest("GET", "/v2/health/ready", ""), 200);
  stack_->GiveDrainNotice();
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ServerReady(&context, request, &response).ok());
  }
  EXPECT_FALSE(response.ready());
  EXPECT_EQ(Rest("GET", "/v2/health/ready", ""), 503);
  EXPECT_EQ(Rest("GET", "/v2/health/live", ""), 200);
}


// A stored memory answers queries alone: output [B, Lq, v] and, on request,
// attention_weights [B, Lq, N], each within its bound of the plain
// reference of the same queries against the memory repeated per batch
// entry; queries of another d are refused naming both shapes; the calls
// count in the model's statistics.
TEST_F(KServeServiceTest, AStoredMemoryAnswersQueriesAlone) {
  std::mt19937 rng(5);
  const int64_t n = 23, d = 6, dv = 3, batch = 2, lq = 3;
  RepositoryModel memory;
  memory.config.set_name("memory");
  memory.config.set_backend(AttentionMemoryKind().backend);
  (*memory.config.mutable_parameters())["score"].set_string_value("gaussian");
  (*memory.config.mutable_parameters())["scale"].set_string_value("0.5");
  const attn::Tensor keys = attn::testing::RandomNormal(rng, {n, d});
  const attn::Tensor values = attn::testing::RandomNormal(rng, {n, dv});
  memory.tensors["keys"] = keys;
  memory.tensors["values"] = values;
  ASSERT_TRUE(repository_->SaveModel({"test", "a memory"}, "memory",
                                     std::move(memory))
                  .ok());
  const attn::Tensor queries = attn::testing::RandomNormal(rng, {batch, lq, d});

  inference::ModelInferRequest request;
  request.set_model_name("memory");
  auto* input = request.add_inputs();
  input->set_name("queries");
  input->set_datatype("FP32");
  for (int64_t dim : queries.shape) input->add_shape(dim);
  request.add_raw_input_contents(
      reinterpret_cast<const char*>(queries.data.data()),
      queries.data.size() * sizeof(float));
  request.add_outputs()->set_name("output");
  request.add_outputs()->set_name("attention_weights");
  inference::ModelInferResponse response;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_EQ(response.outputs_size(), 2);
  const attn::Tensor repeated_keys =
      attn::testing::RepeatAsBatch(keys, batch);
  const attn::Tensor repeated_values =
      attn::testing::RepeatAsBatch(values, batch);
  attn::AttentionRequest plain;
  plain.queries = queries.view();
  plain.keys = repeated_keys.view();
  plain.values = repeated_values.view();
  plain.score = attn::ScoreKind::kGaussian;
  plain.scale = 0.5f;
  plain.return_weights = true;
  const attn::OpResult exact =
      attn::testing::ReferenceEngine().ScaledDotProductAttention(plain).value();
  const attn::testing::ErrorBounds bounds =
      attn::testing::AttentionBounds(plain, exact);
  EXPECT_TRUE(attn::testing::WithinBounds(OutputTensor(response, 0), exact.output, bounds.output));
  EXPECT_TRUE(
      attn::testing::WithinBounds(OutputTensor(response, 1), exact.weights, bounds.weights));
  EXPECT_EQ(OutputTensor(response, 1).shape, (attn::Shape{batch, lq, n}));

  inference::ModelInferRequest wrong_d = request;
  wrong_d.mutable_inputs(0)->set_shape(2, d + 1);
  wrong_d.set_raw_input_contents(
      0, std::string(batch * lq * (d + 1) * sizeof(float), '\0'));
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(&context, wrong_d, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(),
                ::testing::HasSubstr("input 'queries': shape (2, 3, 7) must be "
                                     "(B, Lq, 6): model 'memory' holds keys "
                                     "(23, 6)"));
  }
  EXPECT_EQ(stack_->calls().statistics().Get("memory").success_count, 1u);
}

// A fitted model saved with its training set answers x_query alone, the
// textbook's net(x_test, keys, values): y_pred and, on request,
// attention_weights within their bounds of the plain reference over the
// stored set with the fitted bandwidth, over gRPC and REST; a call that
// sends a training set or a bandwidth of its own is refused.
TEST_F(KServeServiceTest, AFittedModelAnswersQueriesAlone) {
  std::mt19937 rng(8);
  const int64_t n = 40, m = 5, dx = 2;
  const attn::Tensor x_train = attn::testing::RandomNormal(rng, {n, dx});
  const attn::Tensor y_train = attn::testing::RandomNormal(rng, {n});
  const attn::Tensor x_query = attn::testing::RandomNormal(rng, {m, dx});
  ModelCatalogue catalogue(repository_.get());
  ASSERT_TRUE(catalogue
                  .SaveFittedModel("net", 1.7f, x_train.view(), y_train.view())
                  .ok());

  inference::ModelInferRequest request;
  request.set_model_name("net");
  AddFloatInput("x_query", x_query, &request);
  request.add_outputs()->set_name("y_pred");
  request.add_outputs()->set_name("attention_weights");
  inference::ModelInferResponse response;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_EQ(response.outputs_size(), 2);
  attn::NadarayaWatsonRequest plain{x_train.view(), y_train.view(),
                                    x_query.view(),
                                    attn::RegressionKernel::kGaussian, 1.7f,
                                    true};
  const attn::OpResult exact =
      attn::testing::ReferenceEngine().NadarayaWatson(plain).value();
  const attn::testing::ErrorBounds bounds =
      attn::testing::NadarayaWatsonBounds(plain, exact);
  EXPECT_EQ(OutputTensor(response, 0).shape, (attn::Shape{m}));
  EXPECT_TRUE(attn::testing::WithinBounds(OutputTensor(response, 0), exact.output, bounds.output));
  EXPECT_EQ(OutputTensor(response, 1).shape, (attn::Shape{m, n}));
  EXPECT_TRUE(
      attn::testing::WithinBounds(OutputTensor(response, 1), exact.weights, bounds.weights));

  EXPECT_EQ(Rest("POST", "/v2/models/net/infer",
                 R"({"inputs":[{"name":"x_query","datatype":"FP32",)"
                 R"("shape":[2,2],"data":[0.5,1,2,-1]}]})"),
            200);

  inference::ModelInferRequest with_set = request;
  auto* extra = with_set.add_inputs();
  extra->set_name("x_train");
  extra->set_datatype("FP32");
  extra->add_shape(1);
  extra->mutable_contents()->add_fp32_contents(1.0f);
  inference::ModelInferRequest with_bandwidth = request;
  (*with_bandwidth.mutable_parameters())["bandwidth"].set_double_param(2.0);
  for (const auto& [refused, message] :
       {std::pair<const inference::ModelInferRequest*, const char*>{
            &with_set, "model 'net' takes at most 1 inputs (x_query)"},
        {&with_bandwidth, "model 'net' serves its fitted bandwidth"}}) {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(&context, *refused, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(message));
  }
  EXPECT_EQ(stack_->calls().statistics().Get("net").success_count, 2u);
}

// A stored model's metadata carries the dimensions it holds (a client
// learns the d its queries need), and a training set of several outputs
// answers y_pred [m, dy].
TEST_F(KServeServiceTest, StoredModelsReportTheirDimensions) {
  std::mt19937 rng(9);
  const int64_t n = 30, m = 4, dx = 2, dy = 3;
  const attn::Tensor x_train = attn::testing::RandomNormal(rng, {n, dx});
  const attn::Tensor y_train = attn::testing::RandomNormal(rng, {n, dy});
  const attn::Tensor x_query = attn::testing::RandomNormal(rng, {m, dx});
  ASSERT_TRUE(ModelCatalogue(repository_.get())
                  .SaveFittedModel("multi", 0.8f, x_train.view(), y_train.view())
                  .ok());
  RepositoryModel memory;
  memory.config.set_name("memory");
  memory.config.set_backend(AttentionMemoryKind().backend);
  memory.tensors["keys"] = attn::testing::RandomNormal(rng, {7, 5});
  memory.tensors["values"] = attn::testing::RandomNormal(rng, {7, 2});
  ASSERT_TRUE(repository_->SaveModel({"test", "a memory"}, "memory",
                                     std::move(memory))
                  .ok());
  auto metadata = [&](const std::string& name) {
    inference::ModelMetadataRequest request;
    request.set_name(name);
    inference::ModelMetadataResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->ModelMetadata(&context, request, &response).ok());
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& t : response.inputs()) {
      shapes[t.name()].assign(t.shape().begin(), t.shape().end());
    }
    for (const auto& t : response.outputs()) {
      shapes[t.name()].assign(t.shape().begin(), t.shape().end());
    }
    return shapes;
  };
  using Shapes = std::map<std::string, std::vector<int64_t>>;
  EXPECT_EQ(metadata("memory"),
            (Shapes{{"queries", {-1, -1, 5}},
                    {"output", {-1, -1, 2}},
                    {"attention_weights", {-1, -1, 7}}}));
  EXPECT_EQ(metadata("multi"), (Shapes{{"x_query", {-1, dx}},
                                       {"y_pred", {-1, dy}},
                                       {"attention_weights", {-1, n}}}));
  RepositoryModel additive;
  additive.config.set_name("additive");
  additive.config.set_backend(AdditiveAttentionKind().backend);
  additive.tensors["W_q"] = attn::Tensor::Zeros({8, 6});
  additive.tensors["W_k"] = attn::Tensor::Zeros({8, 3});
  additive.tensors["w_v"] = attn::Tensor::Zeros({8});
  ASSERT_TRUE(repository_->SaveModel({"test", "weights"}, "additive",
                                     std::move(additive))
                  .ok());
  EXPECT_EQ(metadata("additive"), (Shapes{{"queries", {-1, -1, 6}},
                                          {"keys", {-1, -1, 3}},
                                          {"values", {-1, -1, -1}},
                                          {"valid_lens", {-1, -1}},
                                          {"output", {-1, -1, -1}},
                                          {"attention_weights", {-1, -1, -1}}}));

  inference::ModelInferRequest request;
  request.set_model_name("multi");
  AddFloatInput("x_query", x_query, &request);
  inference::ModelInferResponse response;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  attn::NadarayaWatsonRequest plain{x_train.view(), y_train.view(),
                                    x_query.view(),
                                    attn::RegressionKernel::kGaussian, 0.8f,
                                    /*return_weights=*/true};  // for the bound
  const attn::OpResult exact =
      attn::testing::ReferenceEngine().NadarayaWatson(plain).value();
  const attn::Tensor got = OutputTensor(response, 0);
  EXPECT_EQ(got.shape, (attn::Shape{m, dy}));
  EXPECT_TRUE(attn::testing::WithinBounds(
      got, exact.output, attn::testing::NadarayaWatsonBounds(plain, exact).output));
}

// Uploads (--model_control_mode=explicit): a load with `config` and
// `file:weights.safetensors` over gRPC (bytes) and REST (base64) writes and
// serves the model, which answers at once; a file of the wrong type or not
// base64 is refused naming the parameter.
class UploadTest : public KServeServiceTest {
 protected:
  ModelControl Control() const override {
    return ModelControl{/*explicit_mode=*/true, /*needs_permission=*/false,
                                        /*on_event=*/{}};
  }
};

TEST_F(UploadTest, AModelUploadedOverEitherProtocolServesAtOnce) {
  std::map<std::string, attn::Tensor> tensors;
  std::mt19937 rng(12);
  tensors["keys"] = attn::testing::RandomNormal(rng, {6, 4});
  tensors["values"] = attn::testing::RandomNormal(rng, {6, 2});
  const std::string bytes = SerializeSafetensors(tensors);
  const std::string config = R"({"backend": "attention_memory"})";

  inference::RepositoryModelLoadRequest load;
  load.set_model_name("uploaded");
  (*load.mutable_parameters())["config"].set_string_param(config);
  (*load.mutable_parameters())["file:weights.safetensors"].set_bytes_param(bytes);
  inference::RepositoryModelLoadResponse loaded;
  {
    grpc::ClientContext context;
    const grpc::Status status =
        stub_->RepositoryModelLoad(&context, load, &loaded);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  inference::ModelInferRequest request;
  request.set_model_name("uploaded");
  auto* input = request.add_inputs();
  input->set_name("queries");
  input->set_datatype("FP32");
  for (int64_t dim : {1, 2, 4}) input->add_shape(dim);
  for (int i = 0; i < 8; ++i) input->mutable_contents()->add_fp32_contents(0.5f);
  inference::ModelInferResponse response;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(OutputTensor(response, 0).shape, (attn::Shape{1, 2, 2}));

  EXPECT_EQ(Rest("POST", "/v2/repository/models/over_rest/load",
                 absl::StrCat(R"({"parameters": {)"
                              R"("config": "{\"backend\": \"attention_memory\"}", )"
                              R"("file:weights.safetensors": ")",
                              absl::Base64Escape(bytes), R"("}})")),
            200);
  EXPECT_EQ(catalogue_->Resolve("over_rest", "")->kind, &AttentionMemoryKind());
  EXPECT_EQ(Rest("POST", "/v2/repository/models/bad/load",
                 R"({"parameters": {"config": "{}", )"
                 R"("file:weights.safetensors": "not base64!"}})"),
            400);

  inference::RepositoryModelLoadRequest wrong_type = load;
  (*wrong_type.mutable_parameters())["file:weights.safetensors"]
      .set_int64_param(3);
  grpc::ClientContext context;
  const grpc::Status status =
      stub_->RepositoryModelLoad(&context, wrong_type, &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              ::testing::HasSubstr("parameter 'file:weights.safetensors': "
                                   "must be bytes, or a string of them in "
                                   "base64"));
  EXPECT_EQ(repository_->Find("bad"), nullptr);
}

// The server's default (--batch_stored_memories without --batching): calls
// on a stored memory go through the batcher, every other call runs alone.
class GainfulBatchingTest : public KServeServiceTest {
 protected:
  ExecutionStack::Options StackOptions() const override {
    ExecutionStack::Options options;
    options.gainful_batching = BatchingOptions{};
    return options;
  }
};

TEST_F(GainfulBatchingTest, OnlyStoredMemoryCallsAreBatched) {
  RepositoryModel memory;
  memory.config.set_name("memory");
  memory.config.set_backend(AttentionMemoryKind().backend);
  memory.tensors["keys"] = attn::Tensor::Zeros({8, 4});
  memory.tensors["values"] = attn::Tensor::Zeros({8, 2});
  ASSERT_TRUE(repository_->SaveModel({"test", "a memory"}, "memory",
                                     std::move(memory))
                  .ok());
  EXPECT_EQ(stack_->batching(), nullptr);  // ModelConfig reports none
  auto infer = [&](const std::string& model,
                   const std::vector<std::pair<std::string, attn::Shape>>&
                       inputs) {
    inference::ModelInferRequest request;
    request.set_model_name(model);
    for (const auto& [name, shape] : inputs) {
      auto* input = request.add_inputs();
      input->set_name(name);
      input->set_datatype("FP32");
      int64_t count = 1;
      for (int64_t dim : shape) {
        input->add_shape(dim);
        count *= dim;
      }
      for (int64_t i = 0; i < count; ++i) {
        input->mutable_contents()->add_fp32_contents(0.5f);
      }
    }
    inference::ModelInferResponse response;
    grpc::ClientContext context;
    return stub_->ModelInfer(&context, request, &response);
  };
  ASSERT_TRUE(infer("dot_product_attention", {{"queries", {1, 2, 4}},
                                              {"keys", {1, 3, 4}},
                                              {"values", {1, 3, 2}}})
                  .ok());
  EXPECT_EQ(Batches("ScaledDotProductAttention"), 0);
  ASSERT_TRUE(infer("memory", {{"queries", {1, 2, 4}}}).ok());
  EXPECT_EQ(Batches("ScaledDotProductAttention"), 1);
  // Calls on a fitted model's training set are not: stacking them does not
  // pay (docs/batching.md), though with --batching they share a class.
  const float x[] = {0.0f, 1.0f, 2.0f}, y[] = {1.0f, 3.0f, 2.0f};
  ASSERT_TRUE(ModelCatalogue(repository_.get())
                  .SaveFittedModel("net", 1.0f, attn::TensorView{x, {3}},
                                   attn::TensorView{y, {3}})
                  .ok());
  ASSERT_TRUE(infer("nadaraya_watson", {{"x_train", {3}},
                                        {"y_train", {3}},
                                        {"x_query", {2}}})
                  .ok());
  ASSERT_TRUE(infer("net", {{"x_query", {2}}}).ok());
  EXPECT_EQ(Batches("NadarayaWatson"), 0);
}


// A stored memory's attention_weights are [B, Lq, N]: sent only when asked
// for, and, over the response limit, refused before the kernel runs, while
// the same call without them is answered.
class SmallResponseLimitTest : public KServeServiceTest {
 protected:
  ExecutionStack::Options StackOptions() const override {
    ExecutionStack::Options options;
    options.limits.max_response_bytes = 4096;
    return options;
  }

  // attnserve_kernel_runs_total, all its series together.
  double KernelRuns() {
    double runs = 0;
    for (const prometheus::MetricFamily& family :
         stack_->metrics().registry()->Collect()) {
      if (family.name != "attnserve_kernel_runs_total") continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        runs += metric.counter.value;
      }
    }
    return runs;
  }
};

TEST_F(SmallResponseLimitTest, AMemorysWeightsComeOnlyWhenAskedAndWithinTheLimit) {
  std::mt19937 rng(21);
  const int64_t n = 2000, d = 4, dv = 2;
  RepositoryModel memory;
  memory.config.set_name("memory");
  memory.config.set_backend(AttentionMemoryKind().backend);
  memory.tensors["keys"] = attn::testing::RandomNormal(rng, {n, d});
  memory.tensors["values"] = attn::testing::RandomNormal(rng, {n, dv});
  ASSERT_TRUE(repository_->SaveModel({"test", "a memory"}, "memory",
                                     std::move(memory))
                  .ok());
  auto request_for = [&](const std::vector<std::string>& outputs) {
    inference::ModelInferRequest request;
    request.set_model_name("memory");
    auto* input = request.add_inputs();
    input->set_name("queries");
    input->set_datatype("FP32");
    for (int64_t dim : {int64_t{1}, int64_t{1}, d}) input->add_shape(dim);
    for (int64_t i = 0; i < d; ++i) {
      input->mutable_contents()->add_fp32_contents(0.25f * i);
    }
    for (const std::string& name : outputs) request.add_outputs()->set_name(name);
    return request;
  };
  inference::ModelInferResponse response;
  {
    // No outputs named: the output alone (the weights would be 8,000 bytes).
    grpc::ClientContext context;
    const grpc::Status status =
        stub_->ModelInfer(&context, request_for({}), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).name(), "output");
  }
  const double kernel_runs_before = KernelRuns();
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->ModelInfer(
        &context, request_for({"output", "attention_weights"}), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("(1, 1, 2000)"));
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("4096"));
  }
  EXPECT_EQ(KernelRuns(), kernel_runs_before);  // refused before it ran
  {
    grpc::ClientContext context;
    const grpc::Status status =
        stub_->ModelInfer(&context, request_for({"output"}), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).shape(2), dv);
  }
}

}  // namespace
}  // namespace attnserve
