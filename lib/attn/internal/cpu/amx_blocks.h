// cpu-amx-blocks: bfloat16 attention without weights with both products on
// AMX tiles, programmed directly (amx_blocks.cc says how). Its pass over one
// task is shared with cpu-key-shares, which runs its shares on it where it
// takes the call.
//
// Internal to the kernel sources: include it inside the ISA region after
// attention_blocks.h (see there for what goes before the region).
#ifndef ATTN_INTERNAL_CPU_AMX_BLOCKS_H_
#define ATTN_INTERNAL_CPU_AMX_BLOCKS_H_

#include <cstdint>
#include <vector>

#include "attn/internal/aligned_vector.h"
#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// Per-thread buffers of the AMX kernel, grown on demand and kept.
struct AmxScratch {
  AlignedVector<uint16_t> queries;        // [row][padded d]
  AlignedVector<uint32_t> key_tiles;      // [16 keys][d / 32][16 pairs][key]
  AlignedVector<uint32_t> value_tiles;    // [32 keys][dv / 16][16 pairs][col]
  AlignedVector<float> scores;            // [row][key block]
  AlignedVector<uint16_t> probabilities;  // [row][key block], bfloat16
  AlignedVector<float> acc;               // [row][padded dv]
  std::vector<float> max, sum, norms;
  std::vector<int64_t> limit;
  // Set when an output the kernel wrote is not finite.
  bool wrote_nonfinite = false;
};

// Whether the AMX kernel takes the call: a call without weights whose
// products read bfloat16 (Precision::kBFloat16 with native bfloat16
// products, or keys and values held as bfloat16 on such a CPU), on the
// avx512 copy with CpuFeatures::amx_tiles, with d and dv even (a key's
// pairs of bfloat16 are whole 32-bit words) and at least 24 query rows
// (fewer leave most of each pair of 16-row tiles empty; amx_blocks.cc).
bool AmxBlocksTake(const CpuCall<AttentionParams>& call);

// One batch entry's and head's keys and values laid out as the tiles the
// kernel reads, for every key of the call (PackAmxTiles).
struct AmxTiles {
  const uint32_t* keys = nullptr;
  const uint32_t* values = nullptr;
};

// Lays out every batch entry's and head's keys and values as tiles, in
// parallel on `threads`, into `buffer` (grown as needed); tiles[bh] then
// points into it. Returns false, doing nothing, when that would take more
// than `max_bytes`. *past_range tells whether a float32 element rounded
// past bfloat16's range (vec_math.h's ToBFloat16PastRange).
bool PackAmxTiles(const AttentionParams& p, const Operands& ops, int threads,
                  int64_t max_bytes, AlignedVector<uint32_t>& buffer,
                  std::vector<AmxTiles>& tiles, bool* past_range);

// One task of a call AmxBlocksTake, over all its keys, writing its rows of
// p.out; or, with `share`, over that share of its keys, leaving the share's
// partial softmax there. `ops` are bfloat16 (attention_blocks.h). The keys
// and values are read from `tiles` (the task's batch entry's and head's)
// where given, else laid out a block at a time in `s`. Returns whether a
// float32 element it rounded was past bfloat16's range.
bool AmxTask(const AttentionParams& p, const Operands& ops, const Task& task,
             AmxScratch& s, const KeyShare* share = nullptr,
             const AmxTiles* tiles = nullptr);

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_AMX_BLOCKS_H_
