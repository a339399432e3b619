#include "client/printer.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "client/tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Format(const PrintOptions& options,
                   google::protobuf::Message* response) {
  absl::StatusOr<std::string> json = FormatResponse(options, response);
  EXPECT_TRUE(json.ok()) << json.status();
  return json.value_or("");
}

attention::v1::MaskedSoftmaxResponse RawResponse() {
  attention::v1::MaskedSoftmaxResponse response;
  response.mutable_output()->add_shape(2);
  WriteElements({0.5f, 0.25f}, attention::v1::TENSOR_ENCODING_RAW,
                response.mutable_output());
  response.mutable_info()->set_implementation("reference");
  return response;
}

TEST(FormatResponseTest, DecodesRawTensors) {
  attention::v1::MaskedSoftmaxResponse response = RawResponse();
  EXPECT_EQ(Format({}, &response),
            R"({"output":{"shape":["2"],"values":[0.5,0.25]},)"
            R"("info":{"implementation":"reference"}})");
}

TEST(FormatResponseTest, KeepsRawWhenAsked) {
  attention::v1::MaskedSoftmaxResponse response = RawResponse();
  PrintOptions options;
  options.keep_raw = true;
  EXPECT_THAT(Format(options, &response), HasSubstr(R"("raw":"AAAAPwAAgD4=")"));
}

TEST(FormatResponseTest, LeavesMalformedRawAsBase64) {
  attention::v1::MaskedSoftmaxResponse response;
  response.mutable_output()->set_raw("abc");
  EXPECT_THAT(Format({}, &response), HasSubstr(R"("raw":"YWJj")"));
}

TEST(FormatResponseTest, SummaryShowsSmallTensorsInFull) {
  attention::v1::MaskedSoftmaxResponse response = RawResponse();
  PrintOptions options;
  options.summary = true;
  EXPECT_EQ(Format(options, &response),
            R"({"output":{"shape":[2],"values":[0.5,0.25]},)"
            R"("info":{"implementation":"reference"}})");
}

TEST(FormatResponseTest, SummarizesBigTensors) {
  attention::v1::AttentionResponse response;
  response.mutable_weights()->add_shape(2);
  response.mutable_weights()->add_shape(10);
  std::vector<float> elements(20, 1.0f);
  elements[0] = -3.0f;
  elements[1] = std::numeric_limits<float>::quiet_NaN();
  WriteElements(elements, attention::v1::TENSOR_ENCODING_RAW,
                response.mutable_weights());
  PrintOptions options;
  options.summary = true;
  EXPECT_EQ(Format(options, &response),
            R"({"weights":{"shape":[2,10],"count":20,"min":-3,"max":1,)"
            R"("mean":0.7894737,"non_finite":1}})");  // 15 / 19
}

TEST(FormatResponseTest, SummarizesLongLossLists) {
  attention::v1::FitBandwidthResponse response;
  response.set_bandwidth(2.5f);
  for (int epoch = 0; epoch < 20; ++epoch) {
    response.add_loss_per_epoch(20 - epoch);
  }
  response.set_final_loss(0.125);
  PrintOptions options;
  options.summary = true;
  EXPECT_EQ(Format(options, &response),
            R"({"bandwidth":2.5,"loss_per_epoch":{"count":20,"min":1,"max":20,)"
            R"("mean":10.5},"final_loss":0.125})");
  options.summary = false;
  EXPECT_THAT(Format(options, &response), Not(HasSubstr(R"("count")")));
}

TEST(FormatResponseTest, SummaryEscapesStrings) {
  attention::v1::FitBandwidthResponse response;
  response.mutable_info()->set_implementation("a\"b\\c\n");
  PrintOptions options;
  options.summary = true;
  EXPECT_EQ(Format(options, &response),
            R"({"info":{"implementation":"a\"b\\c\u000a"}})");
}

}  // namespace
}  // namespace attnctl
