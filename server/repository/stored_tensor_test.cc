// A tensor held in pieces (StoredTensor::pieces): made by ConcatenatedRows,
// narrowed by DropRows across piece boundaries, copied in row order by
// GrowingTensor, and written by the safetensors writer as the same bytes
// as the tensor in one piece.
#include "server/repository/stored_tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attn/tensor.h"
#include "gtest/gtest.h"
#include "server/repository/growing_tensor.h"
#include "server/repository/safetensors.h"

namespace attnserve {
namespace {

// Rows [first, first + n) of width 2, row i all i.
StoredTensor Rows(int64_t first, int64_t n) {
  attn::Tensor rows = attn::Tensor::Zeros({n, 2});
  for (int64_t i = 0; i < n * 2; ++i) {
    rows.data[i] = static_cast<float>(first + i / 2);
  }
  return StoredTensor(std::move(rows));
}

// Its rows' values in order, read part by part.
std::vector<float> RowValues(const StoredTensor& tensor) {
  std::vector<float> values;
  for (const StoredTensor& part : tensor.parts()) {
    EXPECT_FALSE(part.in_pieces());
    values.insert(values.end(), part.values().begin(), part.values().end());
  }
  return values;
}

std::vector<float> Expected(int64_t first, int64_t n) {
  return RowValues(Rows(first, n));
}

TEST(StoredTensorTest, ConcatenatedRowsFlattenAndLeaveOutEmptyParts) {
  const StoredTensor a = Rows(0, 3), b = Rows(3, 4), c = Rows(7, 2);
  const StoredTensor ab = ConcatenatedRows({a, b});
  ASSERT_TRUE(ab.in_pieces());
  EXPECT_EQ(ab.shape, (attn::Shape{7, 2}));
  EXPECT_EQ(ab.data, nullptr);
  EXPECT_TRUE(ab.values().empty());
  EXPECT_TRUE(ab.bytes().empty());
  EXPECT_EQ(ab.byte_size(), 7 * 2 * 4);
  EXPECT_EQ(ab.num_elements(), 14);
  // Parts in pieces are flattened, empty ones dropped.
  const StoredTensor abc =
      ConcatenatedRows({ab, DropRows(c, 2), c, DropRows(a, 3)});
  EXPECT_EQ(abc.pieces.size(), 3u);
  EXPECT_EQ(abc.shape, (attn::Shape{9, 2}));
  EXPECT_EQ(RowValues(abc), Expected(0, 9));
  // One nonempty part is that part itself, sharing its values.
  const StoredTensor alone = ConcatenatedRows({DropRows(a, 3), b});
  EXPECT_FALSE(alone.in_pieces());
  EXPECT_EQ(alone.data, b.data);
  EXPECT_EQ(alone.shape, b.shape);
}

TEST(StoredTensorTest, DropRowsCrossesPiecesAndSharesTheValues) {
  const StoredTensor whole = ConcatenatedRows({Rows(0, 3), Rows(3, 4)});
  for (int64_t dropped = 0; dropped <= 7; ++dropped) {
    SCOPED_TRACE(dropped);
    const StoredTensor kept = DropRows(whole, dropped);
    EXPECT_EQ(kept.shape, (attn::Shape{7 - dropped, 2}));
    EXPECT_EQ(RowValues(kept), Expected(dropped, 7 - dropped));
    // Two pieces while rows of the first are left; then the second alone.
    EXPECT_EQ(kept.in_pieces(), dropped < 3);
    if (dropped >= 3 && dropped < 7) {
      EXPECT_EQ(kept.data, whole.pieces[1].data + (dropped - 3) * 2);
    }
  }
  EXPECT_FALSE(DropRows(whole, 7).is_bfloat16());
}

TEST(StoredTensorTest, BFloat16PiecesKeepTheirType) {
  auto bits = std::make_shared<std::vector<uint16_t>>(10, uint16_t{0x3f80});
  const StoredTensor a({2, 2}, bits->data(), bits);
  const StoredTensor b({3, 2}, bits->data() + 4, bits);
  const StoredTensor ab = ConcatenatedRows({a, b});
  EXPECT_TRUE(ab.is_bfloat16());
  EXPECT_EQ(ab.byte_size(), 5 * 2 * 2);
  EXPECT_TRUE(DropRows(ab, 4).is_bfloat16());
  EXPECT_TRUE(DropRows(ab, 5).is_bfloat16());
}

TEST(StoredTensorTest, GrowingTensorCopiesPiecesInRowOrder) {
  const StoredTensor whole = ConcatenatedRows({Rows(0, 3), Rows(3, 4)});
  absl::StatusOr<GrowingTensor> grown = GrowingTensor::Create(whole, 1 << 20);
  ASSERT_TRUE(grown.ok()) << grown.status();
  ASSERT_TRUE(grown->Append(ConcatenatedRows({Rows(7, 1), Rows(8, 5)})).ok());
  const StoredTensor view = grown->View();
  EXPECT_FALSE(view.in_pieces());
  EXPECT_EQ(view.shape, (attn::Shape{13, 2}));
  EXPECT_EQ(RowValues(view), Expected(0, 13));
}

TEST(StoredTensorTest, SafetensorsWritesPiecesAsOnePiece) {
  const std::map<std::string, StoredTensor> pieced = {
      {"keys", ConcatenatedRows({Rows(0, 3), Rows(3, 4)})}, {"w", Rows(5, 1)}};
  const std::map<std::string, StoredTensor> contiguous = {
      {"keys", Rows(0, 7)}, {"w", Rows(5, 1)}};
  const std::string expected = SerializeSafetensors(contiguous);
  EXPECT_EQ(SerializeSafetensors(pieced), expected);
  EXPECT_EQ(SafetensorsSize(pieced, {}),
            static_cast<int64_t>(expected.size()));
  std::string written;
  ASSERT_TRUE(WriteSafetensors(pieced, [&](absl::string_view bytes) {
                written.append(bytes.data(), bytes.size());
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(written, expected);
}

}  // namespace
}  // namespace attnserve
