// KServe's front ends in process, over the production assembly
// (server/core/execution_stack.h) and a catalogue: what the Python suites
// (tests/kserve/) cannot see from outside.
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "attn/engine.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "prometheus/metric_family.h"
#include "server/core/execution_stack.h"
#include "server/kserve/inference_service.h"
#include "server/kserve/rest_service.h"
#include "server/models/model_catalogue.h"

namespace attnserve {
namespace {

class KServeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stack_ = ExecutionStack::Create(
                 ExecutionStack::Options{},
                 attn::Engine::Create(attn::EngineOptions{}).value())
                 .value();
    catalogue_ = std::make_unique<ModelCatalogue>(nullptr);
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

  std::unique_ptr<ExecutionStack> stack_;
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

}  // namespace
}  // namespace attnserve
