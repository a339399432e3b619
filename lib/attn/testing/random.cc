#include "attn/testing/random.h"

#include "attn/bfloat16.h"

#include <algorithm>
#include <utility>

namespace attn::testing {

Tensor RandomNormal(std::mt19937& rng, Shape shape, float stddev) {
  Tensor tensor = Tensor::Zeros(std::move(shape));
  std::normal_distribution<float> normal(0.0f, stddev);
  for (float& value : tensor.data) value = normal(rng);
  return tensor;
}

std::vector<int32_t> RandomLengths(std::mt19937& rng, int64_t count,
                                   int32_t low, int32_t high) {
  std::uniform_int_distribution<int32_t> uniform(low, high);
  std::vector<int32_t> lengths(count);
  for (int32_t& length : lengths) length = uniform(rng);
  return lengths;
}

LengthsView ViewOf(const std::vector<int32_t>& lengths, Shape shape) {
  return LengthsView{lengths.data(), std::move(shape)};
}

Tensor RepeatAsBatch(const Tensor& tensor, int64_t batch) {
  const int64_t rows = tensor.shape[tensor.shape.size() - 2];
  const int64_t cols = tensor.shape.back();
  Tensor out = Tensor::Zeros({batch, rows, cols});
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(tensor.data.begin(), tensor.data.end(),
              out.data.begin() + b * rows * cols);
  }
  return out;
}

std::vector<uint16_t> RoundToBFloat16Bits(Tensor& tensor) {
  std::vector<uint16_t> bits(tensor.data.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = BFloat16Bits(tensor.data[i]);
    tensor.data[i] = RoundToBFloat16(tensor.data[i]);
  }
  return bits;
}

}  // namespace attn::testing
