#include "attn/tensor.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::testing::HasSubstr;

TEST(ShapeToStringTest, FormatsEveryRank) {
  EXPECT_EQ(ShapeToString({}), "()");
  EXPECT_EQ(ShapeToString({7}), "(7)");
  EXPECT_EQ(ShapeToString({2, 10, 4}), "(2, 10, 4)");
  EXPECT_EQ(ShapeToString({3, 0, -1}), "(3, 0, -1)");
  EXPECT_EQ(ShapeToString({int64_t{1} << 40, 1}), "(1099511627776, 1)");
}

TEST(CheckedNumElementsTest, CountsElements) {
  absl::StatusOr<int64_t> count = CheckedNumElements("x", {2, 10, 4});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 80);

  count = CheckedNumElements("x", {1});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 1);

  count = CheckedNumElements("x", {257, 97, 7});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 257 * 97 * 7);
}

TEST(CheckedNumElementsTest, ScalarShapeHasOneElement) {
  absl::StatusOr<int64_t> count = CheckedNumElements("x", {});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 1);
}

TEST(CheckedNumElementsTest, AcceptsExactlyTheLimit) {
  // 2^31 - 1 itself is allowed...
  absl::StatusOr<int64_t> count =
      CheckedNumElements("x", {kMaxTensorElements});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, kMaxTensorElements);
  // ...and so is a multi-dimensional shape right below it: 2^30 * 1 * 1.
  count = CheckedNumElements("x", {int64_t{1} << 30, 1, 1});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, int64_t{1} << 30);
}

TEST(CheckedNumElementsTest, RejectsZeroDimensionNamingTheArgument) {
  for (const Shape& shape : {Shape{0}, Shape{2, 0, 4}, Shape{3, 4, 0}}) {
    absl::StatusOr<int64_t> count = CheckedNumElements("keys", shape);
    ASSERT_FALSE(count.ok()) << ShapeToString(shape);
    EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(count.status().message(), HasSubstr("keys"));
    EXPECT_THAT(count.status().message(), HasSubstr(ShapeToString(shape)));
  }
}

TEST(CheckedNumElementsTest, RejectsNegativeDimensionNamingTheArgument) {
  for (const Shape& shape :
       {Shape{-1}, Shape{2, -3, 4}, Shape{std::numeric_limits<int64_t>::min()},
        // Two negative dimensions multiply to a positive count (4): the
        // check must look at each dimension, not only at the product.
        Shape{-2, -2}}) {
    absl::StatusOr<int64_t> count = CheckedNumElements("values", shape);
    ASSERT_FALSE(count.ok()) << ShapeToString(shape);
    EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(count.status().message(), HasSubstr("values"));
    EXPECT_THAT(count.status().message(), HasSubstr(ShapeToString(shape)));
  }
}

TEST(CheckedNumElementsTest, RejectsProductsThatOverflowInt64) {
  const int64_t big = int64_t{1} << 40;
  for (const Shape& shape :
       {Shape{big, big}, Shape{big, big, big},
        Shape{std::numeric_limits<int64_t>::max(), 2},
        Shape{2, std::numeric_limits<int64_t>::max()},
        // 2^32 * 2^32 wraps to exactly 0 in 64-bit arithmetic; 2^21 cubed is
        // 2^63, which wraps to INT64_MIN.
        Shape{int64_t{1} << 32, int64_t{1} << 32},
        Shape{int64_t{1} << 21, int64_t{1} << 21, int64_t{1} << 21}}) {
    absl::StatusOr<int64_t> count = CheckedNumElements("queries", shape);
    ASSERT_FALSE(count.ok()) << ShapeToString(shape);
    EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(count.status().message(), HasSubstr("queries"));
    EXPECT_THAT(count.status().message(), HasSubstr(ShapeToString(shape)));
  }
}

TEST(CheckedNumElementsTest, RejectsShapesJustOverTheLimit) {
  for (const Shape& shape :
       {Shape{kMaxTensorElements + 1},
        // 2^16 * 2^15 = 2^31 = kMaxTensorElements + 1.
        Shape{int64_t{1} << 16, int64_t{1} << 15},
        Shape{2, int64_t{1} << 30},
        // 3 * 715827883 = 2147483649 = kMaxTensorElements + 2.
        Shape{3, 715827883}, Shape{715827883, 3},
        Shape{1, 1, kMaxTensorElements + 1}}) {
    absl::StatusOr<int64_t> count = CheckedNumElements("output", shape);
    ASSERT_FALSE(count.ok()) << ShapeToString(shape);
    EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(count.status().message(), HasSubstr("output"));
    EXPECT_THAT(count.status().message(), HasSubstr(ShapeToString(shape)));
  }
  // The neighbour below the limit: 3 * 715827882 = 2^31 - 2.
  absl::StatusOr<int64_t> count = CheckedNumElements("output", {3, 715827882});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, kMaxTensorElements - 1);
}

TEST(TensorTest, ZerosHasShapeAndZeroData) {
  Tensor tensor = Tensor::Zeros({2, 3, 5});
  EXPECT_EQ(tensor.shape, (Shape{2, 3, 5}));
  ASSERT_EQ(tensor.data.size(), 30u);
  for (float value : tensor.data) EXPECT_EQ(value, 0.0f);
  EXPECT_FALSE(tensor.empty());

  TensorView view = tensor.view();
  EXPECT_EQ(view.data, tensor.data.data());
  EXPECT_EQ(view.shape, tensor.shape);
  EXPECT_EQ(view.rank(), 3);
  EXPECT_EQ(view.num_elements(), 30);
}

TEST(TensorTest, DefaultTensorIsEmptyAndLengthsAbsent) {
  EXPECT_TRUE(Tensor{}.empty());
  EXPECT_FALSE(LengthsView{}.present());
  const int32_t lengths[] = {1, 2};
  EXPECT_TRUE((LengthsView{lengths, {2}}.present()));
}

}  // namespace
}  // namespace attn
