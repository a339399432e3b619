// cpu-masked-softmax: the softmax of every row over its valid prefix (any
// kind of valid lengths), vectorized; and the prefix softmax the other
// kernels of this copy normalise their rows with.

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/kernel_copy.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

RowSoftmax SoftmaxPrefixInPlace(float* row, int64_t limit, int64_t columns,
                                float scale) {
  RowSoftmax softmax = {-std::numeric_limits<float>::infinity(), 0.0f};
  if (limit > 0) {
    softmax.max = MaxOf(row, limit, -std::numeric_limits<float>::infinity());
    softmax.sum = ExpShiftedAndSum(row, limit, softmax.max, scale);
    Scale(row, limit, 1.0f / softmax.sum);
  }
  std::fill(row + limit, row + columns, 0.0f);
  return softmax;
}

namespace {

// Every call.
bool Takes(const CpuCall<MaskedSoftmaxParams>&) { return true; }

absl::Status Run(const CpuCall<MaskedSoftmaxParams>& call) {
  const MaskedSoftmaxParams& p = call.params;
  ParallelFor(p.batch * p.rows, call.threads, [&](int64_t task) {
    const int64_t b = task / p.rows;
    const int64_t r = task % p.rows;
    float* row = p.out + task * p.columns;
    std::copy(p.x + task * p.columns, p.x + (task + 1) * p.columns, row);
    SoftmaxPrefixInPlace(row, p.valid.Limit(b, r, p.columns), p.columns, 1.0f);
  });
  return absl::OkStatus();
}

}  // namespace

const CpuImplementation<MaskedSoftmaxParams> kMaskedSoftmax = {
    "cpu-masked-softmax", Takes, Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
