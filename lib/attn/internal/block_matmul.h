// The small matrix products inside the CPU kernels' blocks, run by oneDNN
// matmul primitives on the calling thread.
//
// A product is row-major C[m x n] = A[m x k] * B, or C += A * B, where B is
// either a [k x n] matrix or, with transpose_b, the transpose of the rows of
// an [n x k] matrix (the keys of a score block). C is float32; A and B are
// both float32 or both bfloat16 (the top 16 bits of a float, as uint16_t),
// with float32 accumulation.
//
// Why primitives rather than dnnl_sgemm: oneDNN's brgemm matmul runs these
// block shapes ~10% faster than sgemm in float32, it is the only public way
// to multiply bfloat16 (on AVX512-BF16, about twice float32's speed), and on
// CPUs with AMX it is what runs the tiles on AMX. A primitive compiled for one
// shape costs 0.2-2 ms to create, so only shapes the caller marks as
// recurring (a kernel's full blocks) get one, kept in a bounded process-wide
// cache and bound to each thread that runs it; other float32 shapes run on
// dnnl_sgemm (0.2 us a call against a primitive's 1 us, which small calls
// would feel), other bfloat16 shapes on primitives with run-time dimensions
// (one per transposition and accumulation), created once.
//
// Threads: inside an OpenMP parallel region oneDNN runs the product on the
// calling thread; outside one it uses the calling thread's OpenMP thread
// count. Every function may be called concurrently from any thread (each
// thread brings its own scratchpad and stream).
#ifndef ATTN_INTERNAL_BLOCK_MATMUL_H_
#define ATTN_INTERNAL_BLOCK_MATMUL_H_

#include <cstdint>

namespace attn::internal {

enum class BlockOperands { kFloat32, kBFloat16 };

struct BlockProduct {
  BlockOperands operands = BlockOperands::kFloat32;
  bool transpose_b = false;
  bool accumulate = false;  // C += A * B instead of C = A * B
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row strides, in elements
};

// Runs `product`; `recurring` asks for a primitive compiled for this exact
// shape (use it for shapes a call repeats many times). Returns false when
// oneDNN fails.
bool RunBlockProduct(const BlockProduct& product, bool recurring,
                     const void* a, const void* b, float* c);

// Whether oneDNN multiplies bfloat16 in hardware on this CPU (AVX512-BF16 or
// AMX, after ONEDNN_MAX_CPU_ISA's cap). Elsewhere oneDNN would run bfloat16
// products on slow emulation or reference code, so callers round the
// operands and multiply in float32 instead.
bool HasNativeBFloat16Products();

// Whether oneDNN's bfloat16 products run on AMX tiles here (after the cap).
bool HasAmxProducts();

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_BLOCK_MATMUL_H_
