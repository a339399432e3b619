#include "attn/testing/random.h"

#include "attn/bfloat16.h"

#include <algorithm>
#include <cmath>
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

void RiseScoresPerBlock(Tensor& q, Tensor& k, float rise, int64_t block) {
  const int64_t d = q.shape.back();
  const int64_t lq = static_cast<int64_t>(q.data.size()) / d;
  const int64_t lk = static_cast<int64_t>(k.data.size()) / d;
  // q_r = (1/8, r / 100, 0, ...), k_j[0] = 8 sqrt(d) rise (j / block): at
  // d = 64, 64 rise (j / block) against 1/8, scaled by 1/8.
  for (int64_t r = 0; r < lq; ++r) {
    for (int64_t c = 0; c < d; ++c) q.data[r * d + c] = 0.125f * (c == 0);
    q.data[r * d + 1] += 0.01f * static_cast<float>(r);
  }
  const float steep =
      static_cast<float>(8.0 * std::sqrt(static_cast<double>(d)));
  for (int64_t j = 0; j < lk; ++j) {
    k.data[j * d] = steep * rise * static_cast<float>(j / block);
  }
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
