#include "server/kserve/request.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const ModelTensorNames kAttention{
    "dot_product_attention",
    {"queries", "keys", "values", "valid_lens"},
    {"output", "attention_weights"}};

inference::ModelInferRequest Request(std::initializer_list<const char*> inputs,
                                     std::initializer_list<const char*> outputs,
                                     bool raw) {
  inference::ModelInferRequest request;
  request.set_model_name("dot_product_attention");
  for (const char* name : inputs) {
    auto* input = request.add_inputs();
    input->set_name(name);
    input->set_datatype("FP32");
    input->add_shape(1);
    if (raw) {
      request.add_raw_input_contents(std::string(4, '\0'));
    } else {
      input->mutable_contents()->add_fp32_contents(1.0f);
    }
  }
  for (const char* name : outputs) request.add_outputs()->set_name(name);
  return request;
}

void ExpectInvalid(const inference::ModelInferRequest& request,
                   const std::string& tensor, const std::string& problem) {
  const absl::Status status = CheckInferRequestStructure(request, kAttention);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr(tensor), HasSubstr(problem),
                    HasSubstr("dot_product_attention")));
}

TEST(CheckInferRequestStructure, AcceptsEachTensorOnceRawOrTyped) {
  for (bool raw : {false, true}) {
    EXPECT_TRUE(CheckInferRequestStructure(
                    Request({"queries", "keys", "values"}, {}, raw), kAttention)
                    .ok());
    EXPECT_TRUE(CheckInferRequestStructure(
                    Request({"valid_lens", "values", "keys", "queries"},
                            {"attention_weights", "output"}, raw),
                    kAttention)
                    .ok());
  }
}

TEST(CheckInferRequestStructure, RefusesAnOutputRequestedTwice) {
  ExpectInvalid(Request({"queries", "keys", "values"},
                        {"attention_weights", "output", "attention_weights"},
                        true),
                "output 'attention_weights'", "requested twice");
}

TEST(CheckInferRequestStructure, RefusesHundredsOfCopiesOfOneOutput) {
  inference::ModelInferRequest request =
      Request({"queries", "keys", "values"}, {}, true);
  for (int i = 0; i < 500; ++i) {
    request.add_outputs()->set_name("attention_weights");
  }
  ExpectInvalid(request, "output 'attention_weights'", "requested twice");
}

TEST(CheckInferRequestStructure, RefusesAnUnknownOutput) {
  ExpectInvalid(Request({"queries", "keys", "values"}, {"weights"}, false),
                "output 'weights'", "no such output");
}

TEST(CheckInferRequestStructure, RefusesAnInputGivenTwice) {
  for (bool raw : {false, true}) {
    ExpectInvalid(Request({"queries", "keys", "queries", "values"}, {}, raw),
                  "input 'queries'", "given twice");
  }
}

TEST(CheckInferRequestStructure, RefusesMoreInputsThanTheModelTakes) {
  inference::ModelInferRequest request =
      Request({"queries", "keys", "values"}, {}, true);
  for (int i = 0; i < 5000; ++i) {
    auto* input = request.add_inputs();
    input->set_name("queries");
    request.add_raw_input_contents(std::string(4, '\0'));
  }
  ExpectInvalid(request, "inputs", "at most 4 inputs");
}

TEST(CheckInferRequestStructure, RefusesAnUnknownInput) {
  ExpectInvalid(Request({"queries", "keys", "value"}, {}, false),
                "input 'value'", "no such input");
}

TEST(CheckInferRequestStructure, RefusesRawAndTypedContentsTogether) {
  inference::ModelInferRequest request =
      Request({"queries", "keys", "values"}, {}, true);
  request.mutable_inputs(1)->mutable_contents()->add_fp32_contents(2.0f);
  ExpectInvalid(request, "input 'keys'", "both raw_input_contents and typed");
  // Every kind of typed contents counts, not only the tensor's own type.
  request = Request({"queries", "keys", "values", "valid_lens"}, {}, true);
  request.mutable_inputs(3)->mutable_contents()->add_int64_contents(2);
  ExpectInvalid(request, "input 'valid_lens'", "both raw_input_contents");
}

TEST(CheckInferRequestStructure, RefusesRawContentsNotOnePerInput) {
  inference::ModelInferRequest request =
      Request({"queries", "keys", "values"}, {}, true);
  request.add_raw_input_contents("extra");
  const absl::Status status = CheckInferRequestStructure(request, kAttention);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("raw_input_contents: 4 entries for 3 inputs"));
}

}  // namespace
}  // namespace attnserve
