// onednn-matmul: a batched matmul is oneDNN's matmul primitive. (16-bit
// precisions reach it as float32 operands rounded by the backend.)

#include "absl/status/status.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/cpu/onednn_primitives.h"
#include "attn/params.h"

namespace attn::internal {
namespace {

// Every call.
bool Takes(const CpuCall<BatchMatmulParams>&) { return true; }

absl::Status Run(const CpuCall<BatchMatmulParams>& call) {
  const BatchMatmulParams& p = call.params;
  return call.primitives.Matmul(p.a, p.b, p.out, p.n, p.m, p.k, p.p);
}

}  // namespace

const CpuImplementation<BatchMatmulParams> kOneDnnMatmul = {"onednn-matmul",
                                                            Takes, Run};

}  // namespace attn::internal
