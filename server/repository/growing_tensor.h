// A stored tensor that grows by rows (an attention memory's keys and
// values, a regression's training set, as appends arrive), so that an
// append copies only its own rows.
//
// Its rows live on disk where it is given a folder for them: in a scratch
// file there (FileSystem::NewScratchFile, a file without a name), written
// by pwrite and read through one shared mapping reserved up front for the
// most the tensor may hold (the model's byte limit). So a memory of many
// GiB costs the server page cache, which the kernel may write back and
// drop, not memory of its own. Past the reservation the file is mapped
// again, longer, copying nothing.
//
// Otherwise (no folder, or a file system without scratch files) they live
// in the process's memory: a range of address space reserved the same way,
// whose pages the kernel gives only as rows are written; where that
// reservation is refused (a strict overcommit policy), a buffer replaced by
// one half as large again when full, copying what it holds once (amortized
// O(rows appended)).
//
// The views it hands out (View) cover the rows held when each was made and
// share ownership of the memory or mapping they point into. Appends write
// only past the end of every view made so far, and nothing is moved, so a
// view stays valid and its values unchanged for as long as it lives,
// however the tensor grows after.
//
// Thread-compatible: one writer at a time (the repository's write lock);
// the views are immutable and may be read from any thread meanwhile.
#ifndef ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_
#define ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attn/tensor.h"
#include "server/repository/file_system.h"
#include "server/repository/stored_tensor.h"

namespace attnserve {

class GrowingTensor {
 public:
  // Where the rows may live instead of the process's memory: a scratch
  // file of `fs` in folder `dir` (the model's own, so that they take room
  // on the disk its rows files are on).
  struct OnDisk {
    FileSystem* fs = nullptr;
    std::string dir;
  };

  // Starts with a copy of `tensor` (rank >= 1; its rows are the first
  // dimension; contiguous or in pieces), with room reserved for `max_bytes` in all (at least what
  // it holds); on disk where `on_disk` is given and its file system makes
  // a scratch file there, else in memory (why_in_memory says why). Fails
  // only where writing the scratch file fails (RESOURCE_EXHAUSTED when the
  // disk is full, INTERNAL for EIO).
  static absl::StatusOr<GrowingTensor> Create(const StoredTensor& tensor,
                                              int64_t max_bytes,
                                              const OnDisk* on_disk = nullptr);

  // Appends the rows of `rows` (contiguous or in pieces): the same type
  // (F32 or BF16) and the same dimensions after the first, which the
  // caller has checked. On disk it
  // may fail as Create does; then nothing is appended.
  absl::Status Append(const StoredTensor& rows);

  // The rows held now, as a stored tensor sharing the memory.
  StoredTensor View() const;
  int64_t rows() const { return rows_; }
  // Whether the rows live in a reserved range, in memory or mapped (growth
  // copies nothing).
  bool reserved() const { return reserved_; }
  bool on_disk() const { return file_ != nullptr; }
  // Empty on disk; else why the rows are in the process's memory.
  const std::string& why_in_memory() const { return why_in_memory_; }

 private:
  GrowingTensor(const StoredTensor& tensor, std::string why_in_memory);

  // In memory: makes room for at least `rows` rows in new memory, copying
  // the rows held: a reserved range of `reserve_bytes` (at least `rows`
  // rows) where the kernel grants one, else a buffer of exactly `rows`
  // rows.
  void Reallocate(int64_t rows, size_t reserve_bytes);
  // On disk: maps the file anew for `rows` rows (or `reserve_bytes`).
  absl::Status Remap(int64_t rows, size_t reserve_bytes);

  attn::Shape row_shape_;  // the dimensions after the first
  bool bfloat16_ = false;
  size_t row_bytes_ = 0;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;  // rows the memory or mapping holds room for
  bool reserved_ = false;
  std::string why_in_memory_;
  // On disk: the file written, and its mapping (read-only) that views share.
  std::unique_ptr<ScratchFile> file_;
  std::shared_ptr<const uint8_t> mapped_;
  // In memory: what views share, written in place.
  std::shared_ptr<uint8_t> memory_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_GROWING_TENSOR_H_
