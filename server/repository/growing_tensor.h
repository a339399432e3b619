// A stored tensor that grows by rows (an attention memory's keys and
// values, a regression's training set, as appends arrive), so that an
// append copies only its own rows.
//
// Its values live in one range of address space reserved up front for the
// most the tensor may hold (the model's byte limit), whose pages the kernel
// gives it only as rows are written: growing never moves or copies what is
// there. Where the reservation is refused (a strict overcommit policy), it
// falls back to a buffer that is replaced by one half as large again when
// full, copying what it holds once (amortized O(rows appended)).
//
// The views it hands out (View) cover the rows held when each was made and
// share ownership of the memory they point into. Appends write only past
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
  // dimension), with room reserved for `max_bytes` in all (at least what
  // it holds).
  GrowingTensor(const StoredTensor& tensor, int64_t max_bytes);

  // Appends the rows of `rows`: the same type (F32 or BF16) and the same
  // dimensions after the first, which the caller has checked.
  void Append(const StoredTensor& rows);

  // The rows held now, as a stored tensor sharing the memory.
  StoredTensor View() const;
  int64_t rows() const { return rows_; }
  // Whether the rows live in a reserved range (growth copies nothing).
  bool reserved() const { return reserved_; }

 private:
  // Makes room for at least `rows` rows in new memory, copying the rows
  // held: a reserved range of `reserve_bytes` (at least `rows` rows) where
  // the kernel grants one, else a buffer of exactly `rows` rows.
  void Reallocate(int64_t rows, size_t reserve_bytes);

  attn::Shape row_shape_;  // the dimensions after the first
  bool bfloat16_ = false;
  size_t row_bytes_ = 0;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;  // rows the memory holds room for
  bool reserved_ = false;
  std::shared_ptr<uint8_t> memory_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_
