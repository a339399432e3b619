// A model's tensor as the repository holds it: its shape, and a view of its
// values, float32 (`data`) or bfloat16 bits (`bfloat16`, for a memory stored
// rounded: safetensors' BF16), in storage the tensor shares ownership of,
// either its own buffer or the mapping of the model's weights file
// (server/repository/mapped_file.h), which every tensor of the file shares.
// Copies share the values; nothing writes them once the model is made, so
// a tensor may be read from any number of threads.
#ifndef ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_
#define ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attn/tensor.h"

namespace attnserve {

struct StoredTensor {
  attn::Shape shape;
  const float* data = nullptr;         // float32 values, or null
  const uint16_t* bfloat16 = nullptr;  // else bfloat16 bits
  std::shared_ptr<const void> storage;  // keeps the values alive

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

  bool is_bfloat16() const { return bfloat16 != nullptr; }
  int64_t num_elements() const { return view().num_elements(); }
  // The float32 values (data null for a bfloat16 tensor).
  attn::TensorView view() const { return attn::TensorView{data, shape}; }
  // The values' bytes, as a file holds them (F32 or BF16).
  absl::string_view bytes() const {
    const size_t count = static_cast<size_t>(num_elements());
    return is_bfloat16()
               ? absl::string_view(reinterpret_cast<const char*>(bfloat16),
                                   sizeof(uint16_t) * count)
               : absl::string_view(reinterpret_cast<const char*>(data),
                                   sizeof(float) * count);
  }
  // The float32 values; empty for a bfloat16 tensor.
  absl::Span<const float> values() const {
    if (data == nullptr) return {};
    return {data, static_cast<size_t>(num_elements())};
  }
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_
