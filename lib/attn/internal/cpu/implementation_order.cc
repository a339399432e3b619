// The order in which the CPU backend tries its implementations: one list per
// operation, the first implementation that takes a call runs it
// (attn/internal/cpu/implementation.h). The one place the order is written;
// compiled into every instruction set's copy of the kernels. A specialised
// kernel comes before the general one it beats where it applies, and each
// list ends in one that takes every call the ones before it leave.

#include <algorithm>
#include <cstdint>

#include "attn/internal/cpu/implementation.h"
#include "attn/internal/cpu/implementation_lists.h"
#include "attn/internal/cpu/onednn_primitives.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/cpu/kernel_copy.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

const CpuImplementation<MaskedSoftmaxParams>* const kMaskedSoftmaxOrder[] = {
    &kOneDnnSoftmax,  // "onednn-softmax": no valid lengths
    &kMaskedSoftmax,  // "cpu-masked-softmax": every call
};

const CpuImplementation<BatchMatmulParams>* const kBatchMatmulOrder[] = {
    &kOneDnnMatmul,  // "onednn-matmul": every call
};

const CpuImplementation<AttentionParams>* const kAttentionOrder[] = {
    &kWeightsBlocks,  // "cpu-weights-blocks": the weights are asked for
    &kKeyShares,      // "cpu-key-shares": fewer tasks than threads, many
                      // keys; or the log-sum-exp asked for
    &kAmxColumns,     // "cpu-amx-columns": bfloat16 on AMX tiles, 64 rows
                      // or more, d and dv up to 64 (avx512 copy)
    &kAmxBlocks,      // "cpu-amx-blocks": bfloat16 on AMX tiles (avx512 copy)
    &kLaneAttention,  // "cpu-lane": 2-64 query rows over many keys
    &kColumns,        // "cpu-columns": float32, 64 rows or more, d and dv
                      // up to 64 (avx512 copy)
    &kFusedBlocks,    // "cpu-fused-blocks": every call left
};

const CpuImplementation<AdditiveAttentionParams>* const kAdditiveOrder[] = {
    &kAdditiveAttention,  // "cpu-additive": every call
};

const CpuImplementation<NadarayaWatsonParams>* const kRegressionOrder[] = {
    &kRegression,  // "cpu-regression": every call
};

}  // namespace

extern const CpuImplementationLists kImplementationLists;
const CpuImplementationLists kImplementationLists = {
    kMaskedSoftmaxOrder, kBatchMatmulOrder, kAttentionOrder, kAdditiveOrder,
    kRegressionOrder};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
