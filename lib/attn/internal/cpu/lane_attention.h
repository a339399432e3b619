// cpu-lane: attention of a few query rows over many keys with the rows as
// the lanes of vectors, the kernel for a stored memory's batched queries
// (lane_attention.cc says how it works). Its pass over one task is shared
// with cpu-key-shares, which runs its shares on it where it takes the call.
//
// Internal to the kernel sources: include it inside the ISA region after
// attention_blocks.h (see there for what goes before the region).
#ifndef ATTN_INTERNAL_CPU_LANE_ATTENTION_H_
#define ATTN_INTERNAL_CPU_LANE_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/aligned_vector.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// Per-thread buffers of the lane kernel, grown on demand and kept.
struct LaneScratch {
  std::vector<int64_t> limits;        // [row]: keys the row attends to
  AlignedVector<float> packed_queries;  // [group][c][lane]
  // bfloat16 products: pairs of bfloat16 along the summed dimension.
  AlignedVector<uint32_t> query_pairs;        // [group][c / 2][lane]
  AlignedVector<uint32_t> probability_pairs;  // [key / 2][group][lane]
  AlignedVector<uint32_t> value_pairs;        // [key / 2][dv]
  AlignedVector<float> scores;  // [key][group][lane]: probabilities
  AlignedVector<float> acc;     // [row][dv]
  std::vector<float> corrections;     // [group][lane]
};

// Whether the lane kernel takes the call. It takes a call without weights
// of 2 to 64 query rows (so that each task is all of one batch entry's and
// head's rows, and they fill enough lanes to beat the one-row paths) that
// reads many keys (a stored memory's: some row attends to at least
// kManyKeys), where this copy has the kernel (AVX2 or AVX-512; none on
// baseline x86-64), the values fill whole vectors and, for bfloat16
// operands, the CPU multiplies bfloat16 with AVX512-BF16 (on AMX oneDNN's
// products stay: not measured against them) and a query fills whole pairs.
bool LaneAttentionTakes(const CpuCall<AttentionParams>& call);

// One task of a call LaneAttentionTakes, over all its keys, writing its
// rows of p.out; or, with `share`, over that share of its keys, leaving
// the share's partial softmax there.
void LaneTask(const AttentionParams& p, const Operands& ops, const Task& task,
              LaneScratch& s, const KeyShare* share = nullptr);

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_LANE_ATTENTION_H_
