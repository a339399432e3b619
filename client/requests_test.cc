#include "client/requests.h"

#include <algorithm>
#include <string>
#include <vector>

#include "client/tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnctl {
namespace {

using attention::v1::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<float> Elements(const Tensor& tensor) {
  absl::StatusOr<std::vector<float>> elements = ReadElements(tensor);
  EXPECT_TRUE(elements.ok()) << elements.status();
  return elements.value_or(std::vector<float>{});
}

TEST(ParseDimsTest, ParsesDimensions) {
  absl::StatusOr<Dims> dims = ParseDims("2x10x4");
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_THAT(*dims, ElementsAre(2, 10, 4));
  dims = ParseDims("7");
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_THAT(*dims, ElementsAre(7));
}

TEST(ParseDimsTest, RejectsMalformedAndHugeShapes) {
  for (const char* text :
       {"", "x", "2x", "2xx3", "-1", "2x-3", "a", "2,3", "1x1x1x1x1x1x1x1x1",
        "100000x100000x100", "99999999999999999999"}) {
    EXPECT_EQ(ParseDims(text).status().code(),
              absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(ParseShapesTest, ParsesNamedShapes) {
  absl::StatusOr<std::vector<NamedShape>> shapes =
      ParseShapes({"queries=2x1x2", "", "keys=2x10x2"});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2);
  EXPECT_EQ((*shapes)[0].name, "queries");
  EXPECT_THAT((*shapes)[1].dims, ElementsAre(2, 10, 2));
}

TEST(ParseShapesTest, RejectsMissingDimsAndRepeats) {
  EXPECT_THAT(ParseShapes({"queries"}).status().message(),
              HasSubstr("NAME=DIMS"));
  EXPECT_THAT(ParseShapes({"=2x3"}).status().message(), HasSubstr("NAME=DIMS"));
  EXPECT_THAT(ParseShapes({"a=2", "a=3"}).status().message(),
              HasSubstr("twice"));
  EXPECT_THAT(ParseShapes({"a=2y3"}).status().message(), HasSubstr("a: "));
}

TEST(ParseLengthsTest, DefaultsToOneDimension) {
  absl::StatusOr<attention::v1::Lengths> lengths = ParseLengths("2,6", {});
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_THAT(lengths->shape(), ElementsAre(2));
  EXPECT_THAT(lengths->values(), ElementsAre(2, 6));
}

TEST(ParseLengthsTest, TakesAShapeThatFits) {
  absl::StatusOr<attention::v1::Lengths> lengths =
      ParseLengths("1,2,3,4,5,6", {2, 3});
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_THAT(lengths->shape(), ElementsAre(2, 3));
  EXPECT_THAT(ParseLengths("1,2", {2, 3}).status().message(),
              HasSubstr("holds 6"));
  EXPECT_THAT(ParseLengths("1,x", {}).status().message(),
              HasSubstr("'x' is not an integer"));
}

TEST(ParseChoicesTest, MapsNamesToEnums) {
  EXPECT_EQ(ParseScore("gaussian").value(), attention::v1::SCORE_GAUSSIAN);
  EXPECT_EQ(ParsePrecision("bf16").value(), attention::v1::PRECISION_BFLOAT16);
  EXPECT_EQ(ParsePrecision("fp16").value(), attention::v1::PRECISION_FLOAT16);
  EXPECT_EQ(ParseKernel("epanechnikov").value(),
            attention::v1::REGRESSION_KERNEL_EPANECHNIKOV);
  EXPECT_EQ(ParseEncoding("raw").value(), attention::v1::TENSOR_ENCODING_RAW);
  EXPECT_THAT(ParseKernel("tophat").status().message(),
              HasSubstr("expected one of gaussian, boxcar, constant, "
                        "epanechnikov, got 'tophat'"));
}

TEST(ApplyOptionsTest, GeneratesTheTextbookShapesWithoutInput) {
  RequestOptions options;
  options.generate_missing = true;
  attention::v1::AttentionRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_THAT(request.queries().shape(), ElementsAre(2, 1, 2));
  EXPECT_THAT(request.keys().shape(), ElementsAre(2, 10, 2));
  EXPECT_THAT(request.values().shape(), ElementsAre(2, 10, 4));
  EXPECT_EQ(request.values().values_size(), 80);
  EXPECT_FALSE(request.has_valid_lens());
  EXPECT_FALSE(request.has_scale());
}

TEST(ApplyOptionsTest, SameSeedSameData) {
  RequestOptions options;
  options.generate_missing = true;
  options.seed = 3;
  attention::v1::BatchMatmulRequest first, second;
  ASSERT_TRUE(ApplyOptions(options, &first).ok());
  ASSERT_TRUE(ApplyOptions(options, &second).ok());
  EXPECT_EQ(first.SerializeAsString(), second.SerializeAsString());
  options.seed = 4;
  ASSERT_TRUE(ApplyOptions(options, &second).ok());
  EXPECT_NE(Elements(first.a()), Elements(second.a()));
}

TEST(ApplyOptionsTest, WithInputGeneratesOnlyNamedTensorsAndSetsGivenFields) {
  attention::v1::AttentionRequest request;
  request.mutable_queries()->add_shape(9);
  request.set_causal(true);
  request.set_return_weights(true);
  RequestOptions options;
  options.shapes = {{"keys", {1, 3, 2}}};
  options.causal = false;
  options.scale = 0.25f;
  options.score = attention::v1::SCORE_GAUSSIAN;
  options.valid_lens = ParseLengths("2", {}).value();
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_THAT(request.queries().shape(), ElementsAre(9));
  EXPECT_THAT(request.keys().shape(), ElementsAre(1, 3, 2));
  EXPECT_FALSE(request.has_values());
  EXPECT_FALSE(request.causal());
  EXPECT_TRUE(request.return_weights());
  EXPECT_FLOAT_EQ(request.scale(), 0.25f);
  EXPECT_EQ(request.score(), attention::v1::SCORE_GAUSSIAN);
  EXPECT_THAT(request.valid_lens().values(), ElementsAre(2));
}

TEST(ApplyOptionsTest, RejectsShapeNamesTheRequestLacks) {
  RequestOptions options;
  options.shapes = {{"queries", {1}}};
  attention::v1::MaskedSoftmaxRequest request;
  absl::Status status = ApplyOptions(options, &request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("no tensor 'queries'"));
}

TEST(ApplyOptionsTest, RawEncodingCoversEveryTensorAndTheOutput) {
  RequestOptions options;
  options.generate_missing = true;
  options.encoding = attention::v1::TENSOR_ENCODING_RAW;
  attention::v1::AdditiveAttentionRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.output_encoding(), attention::v1::TENSOR_ENCODING_RAW);
  int tensors = 0;
  ForEachTensor(&request, [&](const std::string& path, Tensor* tensor) {
    ++tensors;
    EXPECT_EQ(tensor->values_size(), 0) << path;
    EXPECT_FALSE(tensor->raw().empty()) << path;
  });
  EXPECT_EQ(tensors, 6);
}

TEST(ApplyOptionsTest, AdditiveWeightsFollowTheInputWidths) {
  RequestOptions options;
  options.generate_missing = true;
  options.shapes = {{"queries", {2, 3, 5}}, {"keys", {2, 7, 6}}, {"w_v", {16}}};
  attention::v1::AdditiveAttentionRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_THAT(request.weights().w_q().shape(), ElementsAre(16, 5));
  EXPECT_THAT(request.weights().w_k().shape(), ElementsAre(16, 6));
  EXPECT_THAT(request.weights().w_v().shape(), ElementsAre(16));
}

TEST(ApplyOptionsTest, KeepsWeightsNameUnlessWeightsAreGenerated) {
  attention::v1::AdditiveAttentionRequest request;
  request.set_weights_name("trained");
  ASSERT_TRUE(ApplyOptions(RequestOptions{}, &request).ok());
  EXPECT_EQ(request.weights_name(), "trained");
}

TEST(ApplyOptionsTest, RegressionGetsTheTextbookData) {
  RequestOptions options;
  options.generate_missing = true;
  attention::v1::NadarayaWatsonRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_THAT(request.x_train().shape(), ElementsAre(50));
  EXPECT_THAT(request.y_train().shape(), ElementsAre(50));
  EXPECT_THAT(request.x_query().shape(), ElementsAre(50));
  const std::vector<float> x = Elements(request.x_train());
  EXPECT_TRUE(std::is_sorted(x.begin(), x.end()));
  EXPECT_GE(x.front(), 0.0f);
  EXPECT_LT(x.back(), 5.0f);
  // y = 2 sin(x) + x^0.8 + noise with sigma 0.5: within 3 sigma nearly
  // always, and within 5 sigma for any seed we will see.
  const std::vector<float> y = Elements(request.y_train());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], 2 * std::sin(x[i]) + std::pow(x[i], 0.8f), 2.5f) << i;
  }
  const std::vector<float> query = Elements(request.x_query());
  EXPECT_FLOAT_EQ(query[0], 0.0f);
  EXPECT_FLOAT_EQ(query[1], 0.1f);
  EXPECT_FLOAT_EQ(query[49], 4.9f);
}

TEST(ApplyOptionsTest, RegressionQueriesFollowTheTrainingWidth) {
  RequestOptions options;
  options.generate_missing = true;
  options.shapes = {{"x_train", {30, 2}}, {"y_train", {30, 3}}};
  attention::v1::NadarayaWatsonRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_THAT(request.x_query().shape(), ElementsAre(50, 2));
  EXPECT_EQ(request.y_train().values_size(), 90);
}

TEST(ApplyOptionsTest, RegressionRejectsMismatchedRowsAndRanks) {
  RequestOptions options;
  options.generate_missing = true;
  options.shapes = {{"y_train", {10}}};
  attention::v1::FitBandwidthRequest request;
  EXPECT_THAT(ApplyOptions(options, &request).message(),
              HasSubstr("as many rows"));
  options.shapes = {{"x_train", {2, 3, 4}}};
  EXPECT_THAT(ApplyOptions(options, &request).message(),
              HasSubstr("(n,) or (n, d)"));
}

TEST(ApplyOptionsTest, AStoredRegressionModelGetsQueriesAlone) {
  RequestOptions options;
  options.generate_missing = true;
  options.model_name = "net";
  attention::v1::NadarayaWatsonRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.model_name(), "net");
  EXPECT_FALSE(request.has_x_train());
  EXPECT_FALSE(request.has_y_train());
  EXPECT_THAT(request.x_query().shape(), ElementsAre(50));
  // A model holding a bandwidth only takes the training set when named.
  options.shapes = {{"x_train", {20}}, {"y_train", {20}}};
  attention::v1::NadarayaWatsonRequest with_set;
  ASSERT_TRUE(ApplyOptions(options, &with_set).ok());
  EXPECT_THAT(with_set.x_train().shape(), ElementsAre(20));
}

TEST(ApplyOptionsTest, FitBandwidthTakesItsHyperparameters) {
  RequestOptions options;
  options.epochs = 20;
  options.learning_rate = 1.0f;
  options.initial_bandwidth = 2.0f;
  attention::v1::FitBandwidthRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.epochs(), 20);
  EXPECT_FLOAT_EQ(request.learning_rate(), 1.0f);
  EXPECT_FLOAT_EQ(request.initial_bandwidth(), 2.0f);
  EXPECT_FALSE(request.has_x_train());
  EXPECT_EQ(request.save_as(), "");
  options.save_as = "net";
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.save_as(), "net");
}

TEST(ApplyOptionsTest, ARefitSendsNoTrainingSet) {
  RequestOptions options;
  options.generate_missing = true;
  options.model_name = "net";
  attention::v1::FitBandwidthRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.model_name(), "net");
  EXPECT_FALSE(request.has_x_train());
  EXPECT_FALSE(request.has_y_train());
}

TEST(ApplyOptionsTest, AppendGetsTheChaptersMemoryAndMayCreate) {
  RequestOptions options;
  options.generate_missing = true;
  options.memory_name = "m";
  attention::v1::AppendMemoryRequest request;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.name(), "m");
  EXPECT_THAT(request.keys().shape(), ElementsAre(10, 2));
  EXPECT_THAT(request.values().shape(), ElementsAre(10, 4));
  EXPECT_FALSE(request.has_create());
  // Settings make a new memory, so they need create.
  options.precision = attention::v1::PRECISION_BFLOAT16;
  options.scale = 0.5f;
  const absl::Status refused = ApplyOptions(options, &request);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--create"));
  options.create = true;
  ASSERT_TRUE(ApplyOptions(options, &request).ok());
  EXPECT_EQ(request.create().precision(), attention::v1::PRECISION_BFLOAT16);
  EXPECT_FLOAT_EQ(request.create().scale(), 0.5f);
  EXPECT_EQ(request.create().score(), attention::v1::SCORE_DOT_PRODUCT);
}

}  // namespace
}  // namespace attnctl
