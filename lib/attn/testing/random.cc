#include "attn/testing/random.h"

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

}  // namespace attn::testing
