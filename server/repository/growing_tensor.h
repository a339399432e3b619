// A stored tensor that grows by rows (an attention memory's keys and
// values, a regression's training set, as appends arrive): its values live
// in a buffer with room for more, so an append copies only its own rows,
// and a full buffer is replaced by one half as large again, copying what it
// holds once (amortized O(rows appended); at most half the rows spare).
//
// The views it hands out (View) cover the rows held when each was made and
// share ownership of the buffer they point into. Appends write only past
// the end of every view made so far, and a full buffer is replaced, never
// moved, so a view stays valid and its values unchanged for as long as it
// lives, however the tensor grows after.
//
// Thread-compatible: one writer at a time (the repository's write lock);
// the views are immutable and may be read from any thread meanwhile.
#ifndef ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_
#define ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "attn/tensor.h"
#include "server/repository/stored_tensor.h"

namespace attnserve {

class GrowingTensor {
 public:
  // Starts with a copy of `tensor` (rank >= 1; its rows are the first
  // dimension), with room for a quarter as many rows again.
  explicit GrowingTensor(const StoredTensor& tensor);

  // Appends the rows of `rows`: the same type (F32 or BF16) and the same
  // dimensions after the first, which the caller has checked.
  void Append(const StoredTensor& rows);

  // The rows held now, as a stored tensor sharing the buffer.
  StoredTensor View() const;
  int64_t rows() const { return rows_; }

 private:
  // Makes room for `rows` rows in a new buffer, copying the rows held.
  void Reserve(int64_t rows);

  attn::Shape row_shape_;   // the dimensions after the first
  bool bfloat16_ = false;
  size_t row_bytes_ = 0;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;  // rows the buffer holds room for
  std::shared_ptr<uint8_t[]> buffer_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_
