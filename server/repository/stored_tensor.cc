#include "server/repository/stored_tensor.h"

#include <algorithm>
#include <utility>

namespace attnserve {
namespace {

int64_t RowElements(const attn::Shape& shape) {
  int64_t elements = 1;
  for (size_t i = 1; i < shape.size(); ++i) elements *= shape[i];
  return elements;
}

// A contiguous tensor's rows [first, first + count).
StoredTensor RowsOf(const StoredTensor& tensor, int64_t first, int64_t count) {
  attn::Shape shape = tensor.shape;
  shape[0] = count;
  const size_t skipped = static_cast<size_t>(first * RowElements(tensor.shape));
  if (tensor.is_bfloat16()) {
    return StoredTensor(std::move(shape), tensor.bfloat16 + skipped,
                        tensor.storage);
  }
  return StoredTensor(std::move(shape), tensor.data + skipped, tensor.storage);
}

}  // namespace

StoredTensor ConcatenatedRows(const std::vector<StoredTensor>& parts) {
  std::vector<StoredTensor> kept;
  for (const StoredTensor& part : parts) {
    for (const StoredTensor& piece : part.parts()) {
      if (piece.shape.empty() || piece.shape[0] > 0) kept.push_back(piece);
    }
  }
  if (kept.empty()) return parts.front().parts().front();
  if (kept.size() == 1) return std::move(kept.front());
  StoredTensor whole;
  whole.shape = kept.front().shape;
  whole.shape[0] = 0;
  for (const StoredTensor& piece : kept) whole.shape[0] += piece.shape[0];
  whole.pieces = std::move(kept);
  return whole;
}

StoredTensor DropRows(const StoredTensor& tensor, int64_t rows) {
  if (rows == 0) return tensor;
  if (!tensor.in_pieces()) {
    return RowsOf(tensor, rows, tensor.shape[0] - rows);
  }
  std::vector<StoredTensor> kept;
  for (const StoredTensor& piece : tensor.pieces) {
    const int64_t dropped = std::min(rows, piece.shape[0]);
    rows -= dropped;
    if (dropped < piece.shape[0]) {
      kept.push_back(RowsOf(piece, dropped, piece.shape[0] - dropped));
    }
  }
  if (kept.empty()) {
    const StoredTensor& last = tensor.pieces.back();
    return RowsOf(last, last.shape[0], 0);
  }
  return ConcatenatedRows(kept);
}

}  // namespace attnserve
