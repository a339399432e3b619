// GrowingTensor: appends past every view made, in a reserved range and in
// the fallback buffer alike; a view keeps its rows, unchanged, however the
// tensor grows after, and its memory after the tensor is gone.
#include "server/repository/growing_tensor.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "attn/tensor.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

// Rows [first, first + n) of width 3, row i all i.
attn::Tensor Rows(int64_t first, int64_t n) {
  attn::Tensor rows = attn::Tensor::Zeros({n, 3});
  for (int64_t i = 0; i < n * 3; ++i)
    rows.data[i] = static_cast<float>(first + i / 3);
  return rows;
}

bool HoldsRows(const StoredTensor& view, int64_t n) {
  if (view.shape != attn::Shape{n, 3}) return false;
  for (int64_t i = 0; i < n * 3; ++i) {
    if (view.data[i] != static_cast<float>(i / 3)) return false;
  }
  return true;
}

TEST(GrowingTensorTest, ViewsKeepTheirRowsWhileItGrows) {
  // 1 MiB reserved; and a limit no address space holds, which the
  // fallback buffer serves.
  for (const int64_t max_bytes :
       {int64_t{1} << 20, std::numeric_limits<int64_t>::max() / 2}) {
    SCOPED_TRACE(max_bytes);
    std::vector<std::pair<StoredTensor, int64_t>> views;
    int64_t rows = 5;
    auto tensor =
        std::make_unique<GrowingTensor>(StoredTensor(Rows(0, 5)), max_bytes);
    EXPECT_EQ(tensor->reserved(), max_bytes == int64_t{1} << 20);
    views.emplace_back(tensor->View(), rows);
    for (int64_t n : {1, 7, 30, 100, 3, 500, 2000}) {
      tensor->Append(StoredTensor(Rows(rows, n)));
      rows += n;
      views.emplace_back(tensor->View(), rows);
      for (const auto& [view, count] : views) {
        ASSERT_TRUE(HoldsRows(view, count)) << count << " of " << rows;
      }
    }
    EXPECT_EQ(tensor->rows(), rows);
    tensor.reset();  // the views own what they read
    for (const auto& [view, count] : views) EXPECT_TRUE(HoldsRows(view, count));
  }
}

TEST(GrowingTensorTest, BFloat16AndRankOneRows) {
  std::vector<uint16_t> bits = {1, 2, 3};
  auto owner = std::make_shared<std::vector<uint16_t>>(bits);
  GrowingTensor tensor(StoredTensor({3}, owner->data(), owner), 1 << 16);
  const StoredTensor before = tensor.View();
  tensor.Append(StoredTensor({3}, owner->data(), owner));
  const StoredTensor after = tensor.View();
  ASSERT_TRUE(after.is_bfloat16());
  EXPECT_EQ(after.shape, attn::Shape{6});
  EXPECT_EQ(before.shape, attn::Shape{3});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(after.bfloat16[i], bits[i % 3]);
}

}  // namespace
}  // namespace attnserve
