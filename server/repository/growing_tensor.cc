#include "server/repository/growing_tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnserve {

GrowingTensor::GrowingTensor(const StoredTensor& tensor,
                             std::string why_in_memory)
    : row_shape_(tensor.shape.begin() + 1, tensor.shape.end()),
      bfloat16_(tensor.is_bfloat16()),
      why_in_memory_(std::move(why_in_memory)) {
  int64_t row_elements = 1;
  for (int64_t dim : row_shape_) row_elements *= dim;
  row_bytes_ = static_cast<size_t>(row_elements) *
               (bfloat16_ ? sizeof(uint16_t) : sizeof(float));
}

absl::StatusOr<GrowingTensor> GrowingTensor::Create(const StoredTensor& tensor,
                                                    int64_t max_bytes,
                                                    const OnDisk* on_disk) {
  std::unique_ptr<ScratchFile> file;
  std::string why_in_memory = "no folder was given for them";
  if (on_disk != nullptr) {
    absl::StatusOr<std::unique_ptr<ScratchFile>> made =
        on_disk->fs->NewScratchFile(on_disk->dir);
    if (made.ok()) {
      file = *std::move(made);
    } else if (absl::IsResourceExhausted(made.status())) {
      return made.status();
    } else {
      why_in_memory = absl::StrCat("no scratch file in the model's folder (",
                                   made.status().message(), ")");
    }
  }
  GrowingTensor grown(tensor, file == nullptr ? why_in_memory : "");
  grown.file_ = std::move(file);
  const int64_t rows = tensor.shape[0];
  const int64_t room = rows + rows / 4 + 16;
  const size_t reserve_bytes =
      std::max(static_cast<size_t>(std::max<int64_t>(max_bytes, 0)),
               static_cast<size_t>(room) * grown.row_bytes_);
  if (grown.file_ != nullptr) {
    if (absl::Status mapped = grown.Remap(room, reserve_bytes); !mapped.ok()) {
      // No mapping this long (address space): the rows stay in memory.
      grown.file_.reset();
      grown.why_in_memory_ = absl::StrCat(
          "the scratch file cannot be mapped (", mapped.message(), ")");
    }
  }
  if (grown.file_ == nullptr) grown.Reallocate(room, reserve_bytes);
  if (absl::Status appended = grown.Append(tensor); !appended.ok()) {
    return appended;
  }
  return grown;
}

absl::Status GrowingTensor::Remap(int64_t rows, size_t reserve_bytes) {
  reserve_bytes =
      std::max(reserve_bytes, static_cast<size_t>(rows) * row_bytes_);
  // The whole reservation at once: past the file's end the mapping shows
  // each row as it is written (views never read further).
  absl::StatusOr<std::shared_ptr<const uint8_t>> mapping =
      file_->Map(static_cast<int64_t>(reserve_bytes));
  if (!mapping.ok()) return mapping.status();
  mapped_ = *std::move(mapping);
  reserved_ = true;
  capacity_ = static_cast<int64_t>(reserve_bytes / row_bytes_);
  return absl::OkStatus();
}

void GrowingTensor::Reallocate(int64_t rows, size_t reserve_bytes) {
  std::shared_ptr<uint8_t> memory;
  // Address space only: MAP_NORESERVE commits no memory, and the kernel
  // gives a page when a row is first written there.
  void* range = mmap(nullptr, reserve_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (range != MAP_FAILED) {
    memory.reset(static_cast<uint8_t*>(range),
                 [reserve_bytes](uint8_t* at) { munmap(at, reserve_bytes); });
    reserved_ = true;
    rows = std::max<int64_t>(rows, reserve_bytes / row_bytes_);
  } else {
    // Uninitialized: every byte a view reads is written first. new[]'s
    // alignment serves float and bfloat16 alike.
    memory.reset(new uint8_t[static_cast<size_t>(rows) * row_bytes_],
                 std::default_delete<uint8_t[]>());
    reserved_ = false;
  }
  if (rows_ > 0) {
    std::memcpy(memory.get(), memory_.get(),
                static_cast<size_t>(rows_) * row_bytes_);
  }
  memory_ = std::move(memory);
  capacity_ = rows;
}

absl::Status GrowingTensor::Append(const StoredTensor& rows) {
  const int64_t added = rows.shape[0];
  size_t end = static_cast<size_t>(rows_) * row_bytes_;
  if (file_ != nullptr) {
    // Written before any view covers it; the mapping shows it (one page
    // cache). Past the reservation, a longer mapping of the same file.
    if (rows_ + added > capacity_) {
      const int64_t room = std::max(capacity_ + capacity_ / 2, rows_ + added);
      if (absl::Status mapped = Remap(room, 0); !mapped.ok()) return mapped;
    }
    // (A part written before a failure lies past every view: the next
    // append writes over it.)
    for (const StoredTensor& part : rows.parts()) {
      const absl::string_view bytes = part.bytes();
      if (absl::Status written =
              file_->WriteAt(static_cast<int64_t>(end), bytes);
          !written.ok()) {
        return written;
      }
      end += bytes.size();
    }
    rows_ += added;
    return absl::OkStatus();
  }
  if (rows_ + added > capacity_) {
    // Past the reservation (or in a plain buffer): 1.5x, amortized
    // O(rows appended), at most half the rows spare.
    const int64_t room = std::max(capacity_ + capacity_ / 2, rows_ + added);
    Reallocate(room, static_cast<size_t>(room) * row_bytes_);
  }
  for (const StoredTensor& part : rows.parts()) {
    const absl::string_view bytes = part.bytes();
    if (bytes.empty()) continue;
    std::memcpy(memory_.get() + end, bytes.data(), bytes.size());
    end += bytes.size();
  }
  rows_ += added;
  return absl::OkStatus();
}

StoredTensor GrowingTensor::View() const {
  attn::Shape shape{rows_};
  shape.insert(shape.end(), row_shape_.begin(), row_shape_.end());
  // Aliases the memory's or the mapping's ownership: the view keeps it
  // alive.
  std::shared_ptr<const void> owner =
      file_ != nullptr ? std::shared_ptr<const void>(mapped_)
                       : std::shared_ptr<const void>(memory_);
  const void* data = owner.get();
  if (bfloat16_) {
    return StoredTensor(std::move(shape), static_cast<const uint16_t*>(data),
                        std::move(owner));
  }
  return StoredTensor(std::move(shape), static_cast<const float*>(data),
                      std::move(owner));
}

}  // namespace attnserve
