// A model's tensor as the repository holds it: its shape, and a view of its
// values, float32 (`data`) or bfloat16 bits (`bfloat16`, for a memory stored
// rounded: safetensors' BF16), in storage the tensor shares ownership of,
// either its own buffer or the mapping of the model's weights file
// (server/repository/mapped_file.h), which every tensor of the file shares.
// Copies share the values; nothing writes them once the model is made, so
// a tensor may be read from any number of threads.
//
// A tensor that grew by rows may instead be held in pieces along its first
// dimension (`pieces`): the rows of its base file, mapped where they lie,
// then those appended since, so that neither a restart nor an append copies
// the base. Only a model whose kind reads pieces is held so
// (ModelRepository::Options::grows_in_pieces); everything that reads values
// goes through parts(), which serves both forms.
#ifndef ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_
#define ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attn/tensor.h"

namespace attnserve {

struct StoredTensor {
  attn::Shape shape;
  const float* data = nullptr;         // float32 values, or null
  const uint16_t* bfloat16 = nullptr;  // else bfloat16 bits
  std::shared_ptr<const void> storage;  // keeps the values alive
  // Held in pieces: two or more contiguous tensors of the same type and
  // dimensions after the first, whose rows follow one another; `shape` is
  // the whole's, and data, bfloat16 and storage are null. Empty: the values
  // are contiguous at data or bfloat16.
  std::vector<StoredTensor> pieces;

  StoredTensor() = default;
  // Takes the tensor's buffer. Implicit: a model is made of attn::Tensors.
  StoredTensor(attn::Tensor tensor)  // NOLINT(google-explicit-constructor)
      : shape(std::move(tensor.shape)) {
    auto buffer = std::make_shared<const attn::FloatBuffer>(
        std::move(tensor.data));
    data = buffer->data();
    storage = std::move(buffer);
  }
  // The values at `values`, which `owner` keeps alive.
  StoredTensor(attn::Shape shape, const float* values,
               std::shared_ptr<const void> owner)
      : shape(std::move(shape)), data(values), storage(std::move(owner)) {}

  // bfloat16 bits at `bits`, which `owner` keeps alive.
  StoredTensor(attn::Shape shape, const uint16_t* bits,
               std::shared_ptr<const void> owner)
      : shape(std::move(shape)), bfloat16(bits), storage(std::move(owner)) {}

  bool is_bfloat16() const {
    return pieces.empty() ? bfloat16 != nullptr : pieces.front().is_bfloat16();
  }
  bool in_pieces() const { return !pieces.empty(); }
  int64_t num_elements() const { return attn::TensorView{data, shape}.num_elements(); }
  // Its contiguous parts in row order: the pieces, or the tensor itself.
  absl::Span<const StoredTensor> parts() const {
    return pieces.empty() ? absl::Span<const StoredTensor>(this, 1)
                          : absl::Span<const StoredTensor>(pieces);
  }
  // The values' size in bytes, as a file holds them (F32 or BF16).
  int64_t byte_size() const {
    return num_elements() * static_cast<int64_t>(is_bfloat16() ? sizeof(uint16_t)
                                                               : sizeof(float));
  }
  // The float32 values (data null for a bfloat16 tensor or one in pieces).
  attn::TensorView view() const { return attn::TensorView{data, shape}; }
  // The values' bytes, as a file holds them (F32 or BF16); empty for a
  // tensor in pieces (each part has its own).
  absl::string_view bytes() const {
    if (in_pieces()) return {};
    const size_t count = static_cast<size_t>(num_elements());
    return is_bfloat16()
               ? absl::string_view(reinterpret_cast<const char*>(bfloat16),
                                   sizeof(uint16_t) * count)
               : absl::string_view(reinterpret_cast<const char*>(data),
                                   sizeof(float) * count);
  }
  // The float32 values; empty for a bfloat16 tensor or one in pieces.
  absl::Span<const float> values() const {
    if (data == nullptr) return {};
    return {data, static_cast<size_t>(num_elements())};
  }
};

// `parts` one after another along their first dimension, all of one type
// and dimensions after the first (the caller's to ensure): the single
// nonempty part itself, else a tensor in pieces (parts in pieces are
// flattened, empty ones left out). At least one part.
StoredTensor ConcatenatedRows(const std::vector<StoredTensor>& parts);

// `tensor` without its first `rows` rows (0 <= rows <= its rows): a view
// of the same values, a piece dropped once all its rows are.
StoredTensor DropRows(const StoredTensor& tensor, int64_t rows);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_
