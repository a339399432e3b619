// cpu-fused-blocks' pass over one task: FlashAttention's online softmax
// over key blocks, both products per block on oneDNN (or, for bfloat16
// operands with few rows, BFloat16Product; attention_blocks.h). Shared with
// cpu-key-shares, whose shares it runs where the lane kernel does not.
//
// Internal to the kernel sources: include it inside the ISA region after
// attention_blocks.h (see there for what goes before the region).
#ifndef ATTN_INTERNAL_CPU_FUSED_BLOCKS_H_
#define ATTN_INTERNAL_CPU_FUSED_BLOCKS_H_

#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// One task over all its keys, writing its rows of p.out; or, with `share`,
// over that share of its keys, leaving the share's partial softmax there.
// Scores are raw dot products (minus half the key norms for the Gaussian
// score); the scale enters in the exponentials. Extra memory is `s`'s
// (MakeScratch), whatever lq and lk are; key blocks past every row's limit
// are never computed. False when oneDNN fails.
bool FusedBlock(const AttentionParams& p, const Operands& ops,
                const Task& task, Scratch& s,
                const KeyShare* share = nullptr);

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_FUSED_BLOCKS_H_
