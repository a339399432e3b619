#include "client/tensors.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnctl {
namespace {

using attention::v1::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(WriteElementsTest, RawIsLittleEndianFloat32) {
  Tensor tensor;
  WriteElements({1.0f, -2.0f}, attention::v1::TENSOR_ENCODING_RAW, &tensor);
  EXPECT_EQ(tensor.values_size(), 0);
  EXPECT_EQ(tensor.raw(), std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8));
}

TEST(WriteElementsTest, ValuesClearRaw) {
  Tensor tensor;
  tensor.set_raw("abcd");
  WriteElements({0.5f}, attention::v1::TENSOR_ENCODING_VALUES, &tensor);
  EXPECT_TRUE(tensor.raw().empty());
  EXPECT_THAT(tensor.values(), ElementsAre(0.5f));
}

TEST(ReadElementsTest, RoundTripsBothEncodings) {
  const std::vector<float> elements = {0.1f, -3.5e-20f, 7e30f, 0.0f};
  for (auto encoding : {attention::v1::TENSOR_ENCODING_VALUES,
                        attention::v1::TENSOR_ENCODING_RAW}) {
    Tensor tensor;
    WriteElements(elements, encoding, &tensor);
    absl::StatusOr<std::vector<float>> read = ReadElements(tensor);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, elements);
  }
}

TEST(ReadElementsTest, RejectsPartialFloats) {
  Tensor tensor;
  tensor.set_raw("abcdef");
  absl::StatusOr<std::vector<float>> read = ReadElements(tensor);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("6 bytes"));
}

TEST(ReencodeTest, LeavesMalformedRawAlone) {
  Tensor tensor;
  tensor.set_raw("abc");
  EXPECT_FALSE(Reencode(attention::v1::TENSOR_ENCODING_VALUES, &tensor).ok());
  EXPECT_EQ(tensor.raw(), "abc");
}

TEST(ForEachTensorTest, VisitsNestedTensorsWithTheirPaths) {
  attention::v1::AdditiveAttentionRequest request;
  request.mutable_queries()->add_shape(1);
  request.mutable_weights()->mutable_w_k()->add_shape(2);
  request.mutable_weights()->mutable_w_v()->add_shape(3);
  std::vector<std::pair<std::string, int64_t>> visited;
  ForEachTensor(&request, [&](const std::string& path, Tensor* tensor) {
    visited.emplace_back(path, tensor->shape(0));
  });
  EXPECT_THAT(visited, ElementsAre(std::make_pair("queries", 1),
                                   std::make_pair("weights.w_k", 2),
                                   std::make_pair("weights.w_v", 3)));
}

}  // namespace
}  // namespace attnctl
