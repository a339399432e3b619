// A model's float32 tensor as the repository holds it: its shape, and a
// view of its values in storage the tensor shares ownership of, either its
// own buffer or the mapping of the model's weights file
// (server/repository/mapped_file.h), which every tensor of the file shares.
// Copies share the values; nothing writes them once the model is made.
#ifndef ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_
#define ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/types/span.h"
#include "attn/tensor.h"

namespace attnserve {

struct StoredTensor {
  attn::Shape shape;
  const float* data = nullptr;
  std::shared_ptr<const void> storage;  // keeps `data` alive

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

  int64_t num_elements() const { return view().num_elements(); }
  attn::TensorView view() const { return attn::TensorView{data, shape}; }
  absl::Span<const float> values() const {
    if (data == nullptr) return {};
    return {data, static_cast<size_t>(num_elements())};
  }
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_STORED_TENSOR_H_
