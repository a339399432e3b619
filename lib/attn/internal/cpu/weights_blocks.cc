// cpu-weights-blocks: attention when the weights are asked for. The raw
// scores of a block of query rows go straight into the weights output (row
// stride lk), are normalised there, and the output is one product with the
// values (of the weights rounded to bfloat16 when the products are): no
// scratch beyond the output the caller asked for. It gives the rows'
// log-sum-exp too where the call asks for it.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "attn/internal/aligned_vector.h"
#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/cpu/kernel_copy.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

bool WeightsBlock(const AttentionParams& p, const Operands& ops,
                  const Task& task, Scratch& s) {
  const int64_t rows = task.rows;
  const void* q = ops.At(ops.q, (task.bh * p.lq + task.q0) * p.d);
  const void* k = ops.At(ops.k, task.bh * p.lk * p.d);
  const void* v = ops.At(ops.v, task.bh * p.lk * p.dv);
  float* out = p.out + (task.bh * p.lq + task.q0) * p.dv;
  float* weights = p.weights + (task.bh * p.lq + task.q0) * p.lk;

  const int64_t key_end = RowLimits(p, task, s.limit.data());
  if (key_end > 0) {
    BlockProduct scores{ops.type, /*transpose_b=*/true, /*accumulate=*/false,
                        rows, key_end, p.d, p.d, p.d, p.lk};
    if (!Product(ops, scores, /*recurring=*/false, q, k, weights)) {
      return false;
    }
    if (p.score == ScoreKind::kGaussian) {
      for (int64_t j0 = 0; j0 < key_end; j0 += s.key_block) {
        const int64_t count = std::min(s.key_block, key_end - j0);
        SubtractKeyNorms(ops, ops.At(k, j0 * p.d), count, p.d, weights + j0,
                         rows, p.lk, s.norms.data());
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const RowSoftmax softmax =
        SoftmaxPrefixInPlace(weights + r * p.lk, s.limit[r], p.lk, p.scale);
    if (p.log_sum_exp != nullptr) {
      const int64_t row = task.bh * p.lq + task.q0 + r;
      p.log_sum_exp[row] = RowLogSumExp(p, ops, row, softmax.max, softmax.sum);
    }
  }
  if (key_end == 0) {
    std::fill(out, out + rows * p.dv, 0.0f);
    return true;
  }
  const void* probabilities = weights;
  int64_t ld = p.lk;
  if (ops.type == BlockOperands::kBFloat16) {
    for (int64_t r = 0; r < rows; ++r) {
      ToBFloat16(weights + r * p.lk, key_end, s.rounded.data() + r * key_end);
    }
    probabilities = s.rounded.data();
    ld = key_end;
  }
  BlockProduct pooled{ops.type, /*transpose_b=*/false, /*accumulate=*/false,
                      rows, p.dv, key_end, ld, p.dv, p.dv};
  return Product(ops, pooled, /*recurring=*/false, probabilities, v, out);
}

// Every call that asks for the weights.
bool Takes(const CpuCall<AttentionParams>& call) {
  return call.params.weights != nullptr;
}

absl::Status Run(const CpuCall<AttentionParams>& call) {
  return RunEveryTask(call, [](const AttentionParams& p, const Operands& ops,
                               const Task& task, Scratch& scratch) {
    return WeightsBlock(p, ops, task, scratch);
  }, /*block_checks_outputs=*/false);
}

}  // namespace

const CpuImplementation<AttentionParams> kWeightsBlocks = {
    "cpu-weights-blocks", Takes, Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
