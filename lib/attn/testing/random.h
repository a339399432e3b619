// Seeded random inputs for tests and benchmarks. Deterministic for a seed.
#ifndef ATTN_TESTING_RANDOM_H_
#define ATTN_TESTING_RANDOM_H_

#include <cstdint>
#include <random>
#include <vector>

#include "attn/tensor.h"

namespace attn::testing {

// A tensor of the given shape with N(0, stddev^2) elements.
Tensor RandomNormal(std::mt19937& rng, Shape shape, float stddev = 1.0f);

// `count` integers uniform in [low, high].
std::vector<int32_t> RandomLengths(std::mt19937& rng, int64_t count,
                                   int32_t low, int32_t high);

// `tensor` ([rows, cols], or [1, rows, cols]) repeated as `batch` entries:
// [batch, rows, cols]. (A stored memory's keys as a plain attention call
// would send them with every batch entry.)
Tensor RepeatAsBatch(const Tensor& tensor, int64_t batch);

// Rounds every element of `tensor` to bfloat16 in place and returns their
// bits: keys or values held as bfloat16 (a memory stored as BF16), both as
// the bits and as the floats they hold.
std::vector<uint16_t> RoundToBFloat16Bits(Tensor& tensor);

// Sets q ([1, lq, d]) and k ([1, lk, d], d >= 2) so that at the default
// scale (1 / sqrt(d)) the scores rise by about `rise` every `block` keys:
// q_r . k_j = sqrt(d) rise (j / block) plus a little of row r. For tests
// of an online softmax's rescaling: each block passes the running max by
// `rise`.
void RiseScoresPerBlock(Tensor& q, Tensor& k, float rise, int64_t block);

// A LengthsView over `lengths` with the given shape.
LengthsView ViewOf(const std::vector<int32_t>& lengths, Shape shape);

}  // namespace attn::testing

#endif  // ATTN_TESTING_RANDOM_H_
