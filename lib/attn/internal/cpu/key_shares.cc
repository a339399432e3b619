// cpu-key-shares: a call with fewer tasks (batch entries x heads x blocks of
// 128 query rows) than threads, over many keys (a stored memory's call: one
// query or a batch of them), shares each task's keys out among the threads
// in whole key blocks. Each share leaves its rows' running max, sum of
// exponentials and unnormalised output; the shares are then merged, each
// rescaled from its own max to the row's. Shares are cut at fixed key
// positions, so the result does not depend on which thread runs which.

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
#include "attn/work.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/cpu/amx_blocks.h"
#include "attn/internal/cpu/fused_blocks.h"
#include "attn/internal/cpu/kernel_copy.h"
#include "attn/internal/cpu/lane_attention.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

// How many shares each task's keys are cut into: enough for every thread
// to have one, each of at least kMinKeysPerShare keys (attn/work.h: the
// server asks it which memories are long enough); 1 for a call with
// weights or with as many tasks as threads, or too few keys.
int64_t SharesPerTask(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  const int64_t tasks = TaskCount(p);
  if (p.weights != nullptr || tasks >= call.threads) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(
                                  (call.threads + tasks - 1) / tasks,
                                  p.lk / kMinKeysPerShare));
}

// out = the shares' outputs, each rescaled from its own max to the row's,
// over the sum of their sums rescaled alike (0 for a row with no key); and
// the row's log-sum-exp where the call asks for it.
template <typename ShareOf>
void MergeKeyShares(const AttentionParams& p, const Operands& ops,
                    int64_t tasks, int64_t shares, const ShareOf& share_of) {
  for (int64_t index = 0; index < tasks; ++index) {
    const Task task = TaskAt(p, index);
    for (int64_t r = 0; r < task.rows; ++r) {
      float max = kNegativeInfinity;
      for (int64_t i = 0; i < shares; ++i) {
        max = std::max(max, share_of(index * shares + i).max[r]);
      }
      float* out = p.out + (task.bh * p.lq + task.q0 + r) * p.dv;
      std::fill(out, out + p.dv, 0.0f);
      float sum = 0.0f;
      for (int64_t i = 0; i < shares; ++i) {
        const KeyShare share = share_of(index * shares + i);
        // A share with no key for this row (max -inf) adds nothing.
        if (share.max[r] == kNegativeInfinity) continue;
        const float weight = FastExp((share.max[r] - max) * p.scale);
        sum += weight * share.sum[r];
        const float* acc = share.acc + r * p.dv;
#pragma omp simd
        for (int64_t c = 0; c < p.dv; ++c) out[c] += weight * acc[c];
      }
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma omp simd
      for (int64_t c = 0; c < p.dv; ++c) out[c] *= inverse;
      if (p.log_sum_exp != nullptr) {
        const int64_t row = task.bh * p.lq + task.q0 + r;
        p.log_sum_exp[row] = RowLogSumExp(p, ops, row, max, sum);
      }
    }
  }
}

// A call without weights whose tasks are fewer than its threads, over at
// least 2 x kMinKeysPerShare keys; and every call without weights that asks
// for the log-sum-exp, which the merge gives (one share per task where
// there are tasks enough).
bool Takes(const CpuCall<AttentionParams>& call) {
  if (call.params.weights != nullptr) return false;
  return call.params.log_sum_exp != nullptr || SharesPerTask(call) > 1;
}

// A thread's buffers: its shares run on the AMX kernel, the lane kernel or
// the blocked one.
struct SharesScratch {
  Scratch blocks;
  LaneScratch lanes;
  AmxScratch tiles;
};

absl::Status Run(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  const int64_t tasks = TaskCount(p);
  const int64_t shares = SharesPerTask(call);
  const int64_t share_blocks =
      ((p.lk + kKeyBlock - 1) / kKeyBlock + shares - 1) / shares;
  const int64_t query_block = std::min(kQueryBlock, p.lq);
  const int64_t share_floats = query_block * (2 + p.dv);
  std::vector<float> partials(tasks * shares * share_floats);
  auto share_of = [&](int64_t item) {
    KeyShare share;
    share.begin = (item % shares) * share_blocks * kKeyBlock;
    share.end = std::min(p.lk, share.begin + share_blocks * kKeyBlock);
    share.max = partials.data() + item * share_floats;
    share.sum = share.max + query_block;
    share.acc = share.sum + query_block;
    return share;
  };
  const AttentionOperands operands(call);
  const Operands& ops = operands.get();
  // The passes are the AMX kernel's or the lane kernel's wherever they take
  // the call (in that order, as in the implementation list).
  const bool tiles = AmxBlocksTake(call);
  const bool lanes = !tiles && LaneAttentionTakes(call);
  const bool ok = ForEachItem(
      tasks * shares, call.threads,
      [&] {
        SharesScratch s;
        if (!tiles && !lanes) {
          s.blocks = MakeScratch(p, ops.type == BlockOperands::kBFloat16);
        }
        return s;
      },
      [&](int64_t item, SharesScratch& scratch) {
        const Task task = TaskAt(p, item / shares);
        const KeyShare share = share_of(item);
        if (tiles) {
          AmxTask(p, ops, task, scratch.tiles, &share);
          return true;
        }
        if (lanes) {
          LaneTask(p, ops, task, scratch.lanes, &share);
          return true;
        }
        return FusedBlock(p, ops, task, scratch.blocks, &share);
      });
  if (!ok) return absl::InternalError("oneDNN matmul failed");
  MergeKeyShares(p, ops, tasks, shares, share_of);
  return absl::OkStatus();
}

}  // namespace

const CpuImplementation<AttentionParams> kKeyShares = {"cpu-key-shares", Takes,
                                                       Run};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
