// cpu-fused-blocks: attention without weights as FlashAttention's online
// softmax. Each task owns up to 128 query rows of one batch entry and head
// and walks 256-key blocks with running row maxima and sums; the two
// products per block run on Product() (attention_blocks.h).

// GCC 12's unmasked AVX-512 intrinsics (softmax_avx512.h) pass
// _mm512_undefined_*() as their masked-off source, which
// -Wmaybe-uninitialized reports wherever they inline; nothing undefined is
// read.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

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
#include "attn/internal/cpu/fused_blocks.h"
#include "attn/internal/cpu/kernel_copy.h"
#include "attn/internal/cpu/softmax_avx512.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

bool FusedBlock(const AttentionParams& p, const Operands& ops,
                const Task& task, Scratch& s, const KeyShare* share) {
  const int64_t rows = task.rows;
  const void* q = ops.At(ops.q, (task.bh * p.lq + task.q0) * p.d);
  const void* k = ops.At(ops.k, task.bh * p.lk * p.d);
  const void* v = ops.At(ops.v, task.bh * p.lk * p.dv);
  float* out = p.out + (task.bh * p.lq + task.q0) * p.dv;
  const bool bf16 = ops.type == BlockOperands::kBFloat16;

  const int64_t key_end = RowLimits(p, task, s.limit.data());
  const int64_t key_begin = share != nullptr ? share->begin : 0;
  const int64_t scan_end =
      share != nullptr ? std::min(key_end, share->end) : key_end;
  std::fill(s.acc.begin(), s.acc.begin() + rows * p.dv, 0.0f);
  std::fill(s.max.begin(), s.max.begin() + rows, kNegativeInfinity);
  std::fill(s.sum.begin(), s.sum.begin() + rows, 0.0f);

  // Over kManyKeys keys, a block shape of fewer rows than a full query
  // block recurs enough to repay compiling it: for float32 from 32 rows
  // (below, sgemm's call is cheaper: 8 x 262,144 keys ran 16 ms on sgemm,
  // 19 ms compiled), for bfloat16 from kFewRows + 1 (whose alternative is a
  // run-time-shaped primitive bound per block: 8 rows 15.5 -> 10.6 ms, 32
  // rows 26.3 -> 20.8 ms; float32's 32 rows 37.6 -> 34.5 ms;
  // BM_MemoryQuery).
  const int64_t min_compiled_rows = bf16 ? kFewRows + 1 : 32;
  const int64_t block = s.key_block;
  for (int64_t j0 = key_begin; j0 < scan_end; j0 += block) {
    const int64_t count = std::min(block, scan_end - j0);
    // Full blocks recur across tasks and calls, or within a call over many
    // keys (a stored memory's): they get primitives compiled for their
    // shape. (Smaller calls' blocks gained nothing measurable from them:
    // 64 x 64 x 64 runs as fast on sgemm.)
    const bool recurring =
        count == kKeyBlock &&
        (rows == kQueryBlock ||
         (rows >= min_compiled_rows && key_end >= kManyKeys));
    BlockProduct scores{ops.type, /*transpose_b=*/true, /*accumulate=*/false,
                        rows, count, p.d, p.d, p.d, block};
    if (!Product(ops, scores, recurring, q, ops.At(k, j0 * p.d),
                 s.scores.data())) {
      return false;
    }
    if (p.score == ScoreKind::kGaussian) {
      SubtractKeyNorms(ops, ops.At(k, j0 * p.d), count, p.d, s.scores.data(),
                       rows, block, s.norms.data());
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s.scores.data() + r * block;
      uint16_t* rounded = s.rounded.data() + r * block;
      const int64_t valid = std::clamp<int64_t>(s.limit[r] - j0, 0, count);
      if (bf16) {
        std::fill(rounded + valid, rounded + count, uint16_t{0});
      } else {
        std::fill(row + valid, row + count, 0.0f);
      }
      if (valid == 0) continue;
#if defined(ATTN_ISA_AVX512)
      // (softmax_avx512.h: the generic loops' per-row reductions cost a
      // third of the exponentials here.)
      const float new_max = RowMax(row, valid, s.max[r]);
#else
      const float new_max = MaxOf(row, valid, s.max[r]);
#endif
      // exp(-inf - finite) == 0: the first block rescales nothing.
      const float correction = FastExp((s.max[r] - new_max) * p.scale);
#if defined(ATTN_ISA_AVX512)
      const float block_sum =
          bf16 ? ExpShiftedSumAndRound(row, valid, new_max, p.scale, rounded)
               : ExpShiftedAndSumInPlace(row, valid, new_max, p.scale);
#else
      const float block_sum =
          bf16 ? ExpShiftedSumAndRound(row, valid, new_max, p.scale, rounded)
               : ExpShiftedAndSum(row, valid, new_max, p.scale);
#endif
      s.sum[r] = s.sum[r] * correction + block_sum;
      s.max[r] = new_max;
      if (correction != 1.0f) Scale(s.acc.data() + r * p.dv, p.dv, correction);
    }
    BlockProduct pooled{ops.type, /*transpose_b=*/false, /*accumulate=*/true,
                        rows, p.dv, count, block, p.dv, p.dv};
    const void* probabilities = bf16 ? static_cast<const void*>(s.rounded.data())
                                     : static_cast<const void*>(s.scores.data());
    if (!Product(ops, pooled, recurring, probabilities, ops.At(v, j0 * p.dv),
                 s.acc.data())) {
      return false;
    }
  }
  if (share != nullptr) {
    std::copy(s.max.begin(), s.max.begin() + rows, share->max);
    std::copy(s.sum.begin(), s.sum.begin() + rows, share->sum);
    std::copy(s.acc.begin(), s.acc.begin() + rows * p.dv, share->acc);
    return true;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = s.sum[r] > 0.0f ? 1.0f / s.sum[r] : 0.0f;
    if (!ScaleIntoFinite(s.acc.data() + r * p.dv, p.dv, inverse,
                         out + r * p.dv)) {
      s.wrote_nonfinite = true;
    }
  }
  return true;
}

namespace {

// Every call without weights, but for those that ask for the log-sum-exp
// (cpu-key-shares runs those, on these blocks).
bool Takes(const CpuCall<AttentionParams>& call) {
  return call.params.weights == nullptr && call.params.log_sum_exp == nullptr;
}

absl::Status Run(const CpuCall<AttentionParams>& call) {
  return RunEveryTask(call, [](const AttentionParams& p, const Operands& ops,
                               const Task& task, Scratch& scratch) {
    return FusedBlock(p, ops, task, scratch);
  }, /*block_checks_outputs=*/true);
}

}  // namespace

const CpuImplementation<AttentionParams> kFusedBlocks = {"cpu-fused-blocks",
                                                         Takes, Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
