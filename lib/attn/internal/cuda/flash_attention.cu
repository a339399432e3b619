// Fused attention forward in the FlashAttention-2 style: a block owns 64
// query rows (16 per warp; 16 rows, one warp, for a call of few rows), walks
// the key tiles that any of its rows may see,
// keeps Q, K and V tiles in shared memory and the scores, running max and
// running sum in registers (online softmax), so no (lq, lk) matrix ever
// reaches global memory. Extra device memory: none beyond the output.
//
// Few query rows over many keys (a stored memory's calls) would leave most
// of the GPU idle, one block per 64 rows: there the keys are split
// (flash-decoding), each block walks one split's tiles and writes its rows'
// unnormalised output with their running max and sum, and a second kernel
// merges the splits exactly, by their log-sum-exp (in double).
//
// Products run on tensor cores through mma.sync:
//  - float32: m16n8k8 TF32 in the 3xTF32 scheme (x = big + small, both TF32;
//    a*b ~ big*big + big*small + small*big), the same as PyTorch's float32
//    memory-efficient kernel; error ~2^-22 relative per product.
//  - bfloat16 / float16: m16n8k16 with float32 accumulation; P is rounded to
//    the operand type before the P.V product, as FlashAttention does.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k8/k16"): lane =
// 4 * g + t. Accumulator c0..c3 hold (row g, cols 2t, 2t+1) and (row g + 8,
// cols 2t, 2t+1). For TF32 we relabel the k index inside each 8-wide slice
// (logical k = t <-> column 2t, k = t + 4 <-> column 2t + 1) on both operands
// of a product; a product's sum does not depend on the order of k, and with
// this labelling the accumulator of Q.K^T is already P's A fragment and every
// shared-memory read is a float2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attn/internal/cuda/kernels.h"

namespace attn::cuda_internal {
namespace {

constexpr int kBlockKeys = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;
// How many 8-dimension slices of Q.K^T are summed from zero before each
// rounded add into the scores (see the note on Mma3xTf32Into): fewer
// adds are faster, more slices per sum less accurate. Measured on an H100
// against PyTorch's float32 kernel: 1 slice gave 0.97x at d = 64 and 0.70x
// at d = 128, 2 slices 1.03x and 0.83x, 4 slices 1.17x and 0.88x; all
// three passed every test, and a model of the tensor cores' truncation put
// the error at <= 0.39 of its bound with 2 slices at d = 64 and <= 0.43 with
// 4 at d = 128 (up to 0.86 with 4 at d = 64).
template <int D>
__host__ __device__ constexpr int ScoreSlice() {
  return D >= 128 ? 4 : 2;
}
constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ int KeyLimit(const KeyLimits& limits, int64_t batch,
                                        int64_t row, int64_t lq, int64_t lk) {
  int64_t limit = lk;
  if (limits.kind == KeyLimits::kPerBatch) {
    limit = limits.valid[batch];
  } else if (limits.kind == KeyLimits::kPerRow) {
    limit = limits.valid[batch * lq + row];
  }
  if (limits.causal) limit = min(limit, row + 1);
  return static_cast<int>(limit);
}

// 16-byte asynchronous global -> shared copy; zero-fills when !valid.
__device__ __forceinline__ void CopyAsync16(void* smem, const void* gmem,
                                            bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void CopyAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Copies rows [row0, row0 + kRows) of a (rows, D) matrix of T into a shared
// tile with row stride kStride elements, with the block's kThreads threads;
// rows at or past `rows` become zeros (so a masked-out key's value can never
// be NaN * 0).
template <typename T, int D, int kStride, int kRows, int kThreads>
__device__ __forceinline__ void LoadTile(T* tile, const T* matrix,
                                         int64_t row0, int64_t rows) {
  constexpr int kChunksPerRow = D * sizeof(T) / 16;
  constexpr int kElemsPerChunk = 16 / sizeof(T);
  for (int chunk = threadIdx.x; chunk < kRows * kChunksPerRow;
       chunk += kThreads) {
    const int r = chunk / kChunksPerRow;
    const int c = (chunk % kChunksPerRow) * kElemsPerChunk;
    const bool valid = row0 + r < rows;
    const T* src = valid ? matrix + (row0 + r) * D + c : matrix;
    CopyAsync16(tile + r * kStride + c, src, valid);
  }
}

// ---- float32: 3xTF32 -------------------------------------------------------

__device__ __forceinline__ uint32_t ToTf32(float x) {
  uint32_t out;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(out) : "f"(x));
  return out;
}

__device__ __forceinline__ void SplitTf32(float x, uint32_t& big,
                                          uint32_t& small) {
  big = ToTf32(x);
  small = ToTf32(x - __uint_as_float(big));
}

__device__ __forceinline__ void MmaTf32(float (&c)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// acc += a * b to float32 accuracy from split operands, all three products
// into acc.
//
// The tensor cores do not round a sum to nearest: they truncate it to
// float32 at the scale of its largest term, always toward zero. Products
// accumulated straight into a long running sum are truncated at that sum's
// scale on every instruction; on an H100 that bias alone put a 97 x 257
// float32 attention at ~1.5x its error bound (twice a naive float32
// computation's error). So the running sums (the scores over d, the output
// over the keys) take their products in slices summed from zero in `acc`,
// each then added with one ordinary, correctly rounded add: the scores a
// few 8-dimension slices at a time (ScoreSlice), the output a 64-key tile
// at a time.
__device__ __forceinline__ void Mma3xTf32Into(float (&acc)[4],
                                              const uint32_t (&a_big)[4],
                                              const uint32_t (&a_small)[4],
                                              const uint32_t (&b_big)[2],
                                              const uint32_t (&b_small)[2]) {
  MmaTf32(acc, a_small, b_big);
  MmaTf32(acc, a_big, b_small);
  MmaTf32(acc, a_big, b_big);
}

// ---- bfloat16 / float16 ----------------------------------------------------

template <typename T>
struct Half2;
template <>
struct Half2<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Half2<__half> {
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <typename T>
__device__ __forceinline__ void Mma16(float (&c)[4], const uint32_t (&a)[4],
                                      uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void Mma16<__nv_bfloat16>(float (&c)[4],
                                                     const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma16<__half>(float (&c)[4],
                                              const uint32_t (&a)[4],
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4],
                                                const void* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}

// ---- the shared online-softmax step ---------------------------------------

// Scales the tile's scores to log2 units, masks keys at or past each row's
// limit, updates the running max m and partial sum l of rows g and g + 8, and
// rescales the output accumulators. s[n][e]: key tile column n * 8 + 2t +
// (e & 1) of row g (e < 2) or g + 8 (e >= 2).
template <int kDTiles>
__device__ __forceinline__ void OnlineSoftmax(float (&s)[8][4],
                                              float (&o)[kDTiles][4],
                                              float (&m)[2], float (&l)[2],
                                              const int (&limit)[2], int key0,
                                              float scale_log2) {
  const int t = threadIdx.x % 4;
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + n * 8 + 2 * t + (e & 1);
      const int r = e >> 1;
      s[n][e] = key < limit[r] ? s[n][e] * scale_log2 : kNegInf;
      tile_max[r] = fmaxf(tile_max[r], s[n][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r]);
    // A row with no visible key yet keeps m = -inf; subtracting 0 instead
    // makes its probabilities exp2(-inf) = 0 rather than NaN.
    const float m_ref = m_new == kNegInf ? 0.0f : m_new;
    const float alpha = exp2f(m[r] - m_ref);
    m[r] = m_new;
    l[r] *= alpha;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      o[n][2 * r] *= alpha;
      o[n][2 * r + 1] *= alpha;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][2 * r] = exp2f(s[n][2 * r] - m_ref);
      s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - m_ref);
      l[r] += s[n][2 * r] + s[n][2 * r + 1];
    }
  }
}

// Divides by the row sums and writes rows g and g + 8 of the warp's 16 rows.
template <int D>
__device__ __forceinline__ void StoreOutput(float (&o)[D / 8][4], float (&l)[2],
                                            float* out, int64_t row_g,
                                            int64_t lq) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int64_t row = row_g + 8 * r;
    if (row >= lq) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2 value = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      *reinterpret_cast<float2*>(out + row * D + n * 8 + 2 * t) = value;
    }
  }
}

// Writes one split's rows g and g + 8: the unnormalised output, and the
// running max (log2 units) and sum, for MergeKeySplits.
template <int D>
__device__ __forceinline__ void StorePartial(float (&o)[D / 8][4],
                                             const float (&m)[2], float (&l)[2],
                                             const FusedAttentionArgs& a,
                                             int64_t bh, int64_t row_g) {
  const int t = threadIdx.x % 4;
  const int64_t rows = a.batch * a.heads * a.lq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    const int64_t row = row_g + 8 * r;
    if (row >= a.lq) continue;
    const int64_t at = blockIdx.y * rows + bh * a.lq + row;
    float* out = a.partial_out + at * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(out + n * 8 + 2 * t) =
          make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
    if (t == 0) {
      a.partial_stats[2 * at] = m[r];
      a.partial_stats[2 * at + 1] = l[r];
    }
  }
}

// The first key tile no row of this block sees: the largest key limit.
template <int kBlockRows>
__device__ __forceinline__ int BlockKeyTiles(const FusedAttentionArgs& a,
                                             int64_t batch, int64_t row0,
                                             int* shared_max) {
  if (threadIdx.x == 0) *shared_max = 0;
  __syncthreads();
  if (threadIdx.x < kBlockRows && row0 + threadIdx.x < a.lq) {
    atomicMax(shared_max, KeyLimit(a.limits, batch, row0 + threadIdx.x, a.lq, a.lk));
  }
  __syncthreads();
  return (*shared_max + kBlockKeys - 1) / kBlockKeys;
}

// Where a block and a thread stand: the (batch, head) slice, the block's
// first query row, the thread's rows g and g + 8 and their key limits, and
// the key tiles [tile_begin, tile_end) the block walks: its split's share of
// those any of its rows sees. Both kernels start from it.
template <typename T, int D, int kBlockRows>
struct BlockPosition {
  int64_t bh, batch, row0, row_g;
  int limit[2];
  int tile_begin, tile_end;
  const T *q, *k, *v;
  float* out;

  __device__ BlockPosition(const FusedAttentionArgs& a, int64_t query_tiles,
                           int* shared_max) {
    bh = blockIdx.x / query_tiles;
    row0 = (blockIdx.x % query_tiles) * kBlockRows;
    batch = bh / a.heads;
    q = static_cast<const T*>(a.q) + bh * a.lq * D;
    k = static_cast<const T*>(a.k) + bh * a.lk * D;
    v = static_cast<const T*>(a.v) + bh * a.lk * D;
    out = a.out + bh * a.lq * D;
    row_g = row0 + (threadIdx.x / 32) * 16 + (threadIdx.x % 32) / 4;
    for (int r = 0; r < 2; ++r) {
      limit[r] = row_g + 8 * r < a.lq
                     ? KeyLimit(a.limits, batch, row_g + 8 * r, a.lq, a.lk)
                     : 0;
    }
    const int key_tiles = BlockKeyTiles<kBlockRows>(a, batch, row0, shared_max);
    const int64_t begin = blockIdx.y * a.tiles_per_split;
    tile_begin = static_cast<int>(begin < key_tiles ? begin : key_tiles);
    tile_end = static_cast<int>(
        begin + a.tiles_per_split < key_tiles ? begin + a.tiles_per_split
                                              : key_tiles);
  }
};

// The split's result: final rows when the keys are not split, else partials.
template <int D>
__device__ __forceinline__ void StoreRows(float (&o)[D / 8][4],
                                          const float (&m)[2], float (&l)[2],
                                          const FusedAttentionArgs& a,
                                          int64_t bh, float* out,
                                          int64_t row_g) {
  if (a.key_splits == 1) {
    StoreOutput<D>(o, l, out, row_g, a.lq);
  } else {
    StorePartial<D>(o, m, l, a, bh, row_g);
  }
}

// ---- the kernels -------------------------------------------------------

// float32 operands. Shared: Q and K with row stride D + 8 floats, V with
// D + 4 (conflict-free float2 reads of Q/K and scalar reads of V).
template <int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    FusedAttentionF32(FusedAttentionArgs a, int64_t query_tiles) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kBlockRows = kWarps * 16;
  constexpr int kQkStride = D + 8;
  constexpr int kVStride = D + 4;
  constexpr int kDTiles = D / 8;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  float* q_tile = reinterpret_cast<float*>(shared_raw);
  float* k_tile = q_tile + kBlockRows * kQkStride;
  float* v_tile = k_tile + kBlockKeys * kQkStride;
  __shared__ int block_limit;
  const BlockPosition<float, D, kBlockRows> at(a, query_tiles, &block_limit);
  const float *q = at.q, *k = at.k, *v = at.v;
  const int64_t row0 = at.row0, row_g = at.row_g;
  const int tile_begin = at.tile_begin, tile_end = at.tile_end;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  LoadTile<float, D, kQkStride, kBlockRows, kThreads>(q_tile, q, row0, a.lq);
  if (tile_begin < tile_end) {
    LoadTile<float, D, kQkStride, kBlockKeys, kThreads>(
        k_tile, k, int64_t{tile_begin} * kBlockKeys, a.lk);
  }
  CopyAsyncCommit();

  float o[kDTiles][4] = {};
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  const float scale_log2 = a.scale * kLog2e;
  const float* q_warp = q_tile + warp * 16 * kQkStride;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int key0 = tile * kBlockKeys;
    CopyAsyncWait<0>();
    __syncthreads();  // K(tile) visible; V's buffer free
    LoadTile<float, D, kVStride, kBlockKeys, kThreads>(v_tile, v, key0, a.lk);
    CopyAsyncCommit();

    float s[8][4] = {};
    float part[8][4];  // the scores' current slice of dimensions
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk) {
      if (kk % ScoreSlice<D>() == 0) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) part[n][e] = 0.0f;
        }
      }
      const float2 q_lo = *reinterpret_cast<const float2*>(
          q_warp + g * kQkStride + kk * 8 + 2 * t);
      const float2 q_hi = *reinterpret_cast<const float2*>(
          q_warp + (g + 8) * kQkStride + kk * 8 + 2 * t);
      uint32_t a_big[4], a_small[4];
      SplitTf32(q_lo.x, a_big[0], a_small[0]);
      SplitTf32(q_hi.x, a_big[1], a_small[1]);
      SplitTf32(q_lo.y, a_big[2], a_small[2]);
      SplitTf32(q_hi.y, a_big[3], a_small[3]);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const float2 kv = *reinterpret_cast<const float2*>(
            k_tile + (n * 8 + g) * kQkStride + kk * 8 + 2 * t);
        uint32_t b_big[2], b_small[2];
        SplitTf32(kv.x, b_big[0], b_small[0]);
        SplitTf32(kv.y, b_big[1], b_small[1]);
        Mma3xTf32Into(part[n], a_big, a_small, b_big, b_small);
      }
      if (kk % ScoreSlice<D>() == ScoreSlice<D>() - 1 || kk == D / 8 - 1) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] += part[n][e];
        }
      }
    }

    OnlineSoftmax<kDTiles>(s, o, m, l, at.limit, key0, scale_log2);

    CopyAsyncWait<0>();
    __syncthreads();  // V(tile) visible; every warp is done with K(tile)
    if (tile + 1 < tile_end) {
      LoadTile<float, D, kQkStride, kBlockKeys, kThreads>(
          k_tile, k, key0 + kBlockKeys, a.lk);
    }
    CopyAsyncCommit();

    // P's fragments for the tile's eight 8-key slices, split once.
    uint32_t p_big[8][4], p_small[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      SplitTf32(s[kk][0], p_big[kk][0], p_small[kk][0]);
      SplitTf32(s[kk][2], p_big[kk][1], p_small[kk][1]);
      SplitTf32(s[kk][1], p_big[kk][2], p_small[kk][2]);
      SplitTf32(s[kk][3], p_big[kk][3], p_small[kk][3]);
    }
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      float slice[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        uint32_t b_big[2], b_small[2];
        SplitTf32(v_tile[(kk * 8 + 2 * t) * kVStride + n * 8 + g], b_big[0],
                  b_small[0]);
        SplitTf32(v_tile[(kk * 8 + 2 * t + 1) * kVStride + n * 8 + g],
                  b_big[1], b_small[1]);
        Mma3xTf32Into(slice, p_big[kk], p_small[kk], b_big, b_small);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] += slice[e];
    }
  }
  CopyAsyncWait<0>();
  StoreRows<D>(o, m, l, a, at.bh, at.out, row_g);
}

// bfloat16 / float16 operands; every tile has row stride D + 8 elements
// (16 bytes of padding: conflict-free ldmatrix).
template <typename T, int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    FusedAttention16(FusedAttentionArgs a, int64_t query_tiles) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kBlockRows = kWarps * 16;
  constexpr int kStride = D + 8;
  constexpr int kDTiles = D / 8;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* q_tile = reinterpret_cast<T*>(shared_raw);
  T* k_tile = q_tile + kBlockRows * kStride;
  T* v_tile = k_tile + kBlockKeys * kStride;
  __shared__ int block_limit;
  const BlockPosition<T, D, kBlockRows> at(a, query_tiles, &block_limit);
  const T *q = at.q, *k = at.k, *v = at.v;
  const int64_t row0 = at.row0, row_g = at.row_g;
  const int tile_begin = at.tile_begin, tile_end = at.tile_end;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  LoadTile<T, D, kStride, kBlockRows, kThreads>(q_tile, q, row0, a.lq);
  if (tile_begin < tile_end) {
    LoadTile<T, D, kStride, kBlockKeys, kThreads>(
        k_tile, k, int64_t{tile_begin} * kBlockKeys, a.lk);
  }
  CopyAsyncCommit();

  float o[kDTiles][4] = {};
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.0f, 0.0f};
  const float scale_log2 = a.scale * kLog2e;
  // ldmatrix row addresses (see the layout notes at the top of the file).
  const T* q_lane = q_tile + (warp * 16 + lane % 16) * kStride + (lane / 16) * 8;
  const int k_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_col = ((lane >> 3) & 1) * 8;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int v_col = (lane >> 4) * 8;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int key0 = tile * kBlockKeys;
    CopyAsyncWait<0>();
    __syncthreads();
    LoadTile<T, D, kStride, kBlockKeys, kThreads>(v_tile, v, key0, a.lk);
    CopyAsyncCommit();

    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      LdMatrixX4(qa, q_lane + kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // pairs of 8-key column tiles
        uint32_t kb[4];
        LdMatrixX4(kb, k_tile + (np * 16 + k_row) * kStride + kk * 16 + k_col);
        Mma16<T>(s[2 * np], qa, kb[0], kb[1]);
        Mma16<T>(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    OnlineSoftmax<kDTiles>(s, o, m, l, at.limit, key0, scale_log2);

    CopyAsyncWait<0>();
    __syncthreads();
    if (tile + 1 < tile_end) {
      LoadTile<T, D, kStride, kBlockKeys, kThreads>(k_tile, k,
                                                     key0 + kBlockKeys, a.lk);
    }
    CopyAsyncCommit();

#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // 16-key slices of the tile
      uint32_t pa[4];
      pa[0] = Half2<T>::Pack(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = Half2<T>::Pack(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = Half2<T>::Pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = Half2<T>::Pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < kDTiles / 2; ++np) {
        uint32_t vb[4];
        LdMatrixX4Trans(vb, v_tile + (kk * 16 + v_row) * kStride + np * 16 + v_col);
        Mma16<T>(o[2 * np], pa, vb[0], vb[1]);
        Mma16<T>(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
  }
  CopyAsyncWait<0>();
  StoreRows<D>(o, m, l, a, at.bh, at.out, row_g);
}

// out (rows, d) from the splits' partials: row r's output is
// sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), M = max_s m_s, in double;
// a row no split saw a key of is zeros. One block per row: the max over the
// splits first, then each warp sums every kMergeWarps-th split (its lanes
// over the columns, d <= 128), then the warps' sums are added. Splitting
// the loop over the splits among the warps matters: one thread walking
// ~1,000 splits' dependent loads took most of a call's time (H200).
constexpr int kMergeWarps = 8;
__global__ void __launch_bounds__(kMergeWarps * 32)
    MergeKeySplits(const float* partial_out, const float* partial_stats,
                   float* out, int64_t rows, int splits, int d) {
  __shared__ float warp_max[kMergeWarps];
  __shared__ double warp_sum[kMergeWarps];
  __shared__ double warp_value[kMergeWarps * 128];
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = kNegInf;
  for (int s = threadIdx.x; s < splits; s += kMergeWarps * 32) {
    m = fmaxf(m, partial_stats[2 * (s * rows + row)]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, offset));
  }
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  float max_m = warp_max[0];
  for (int w = 1; w < kMergeWarps; ++w) max_m = fmaxf(max_m, warp_max[w]);
  if (max_m == kNegInf) {
    if (threadIdx.x < d) out[row * d + threadIdx.x] = 0.0f;
    return;
  }
  // A split that saw no key has m = -inf, so weight 0, and l = o = 0.
  const int columns = d / 32;
  double sum = 0.0, value[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll 4
  for (int s = warp; s < splits; s += kMergeWarps) {
    const int64_t at = s * rows + row;
    const double w =
        exp2(static_cast<double>(partial_stats[2 * at]) - max_m);
    sum += w * partial_stats[2 * at + 1];
    const float* o = partial_out + at * d;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < columns) value[j] += w * o[lane + 32 * j];
    }
  }
  if (lane == 0) warp_sum[warp] = sum;
  for (int j = 0; j < columns; ++j) {
    warp_value[warp * 128 + lane + 32 * j] = value[j];
  }
  __syncthreads();
  if (threadIdx.x < d) {
    double total = 0.0, total_value = 0.0;
    for (int w = 0; w < kMergeWarps; ++w) {
      total += warp_sum[w];
      total_value += warp_value[w * 128 + threadIdx.x];
    }
    out[row * d + threadIdx.x] =
        total > 0.0 ? static_cast<float>(total_value / total) : 0.0f;
  }
}

template <int kWarps, typename Kernel>
cudaError_t Launch(Kernel kernel, size_t shared_bytes,
                   const FusedAttentionArgs& args, cudaStream_t stream) {
  const int64_t query_tiles = (args.lq + kWarps * 16 - 1) / (kWarps * 16);
  const int64_t blocks = args.batch * args.heads * query_tiles;
  if (blocks <= 0 || blocks > 0x7fffffff || args.key_splits < 1 ||
      args.key_splits > 65535 || args.tiles_per_split < 1) {
    return cudaErrorInvalidConfiguration;
  }
  // Above 48 KiB a kernel must opt in; the attribute is per function, and
  // setting it again is harmless, so every launch sets it (cheap, and
  // correct whichever thread launches first).
  cudaError_t status = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(shared_bytes));
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(blocks),
                  static_cast<unsigned>(args.key_splits));
  kernel<<<grid, kWarps * 32, shared_bytes, stream>>>(args, query_tiles);
  status = cudaGetLastError();
  if (status != cudaSuccess || args.key_splits == 1) return status;
  return LaunchMergeKeySplits(args.partial_out, args.partial_stats, args.out,
                              args.batch * args.heads * args.lq,
                              args.key_splits, static_cast<int>(args.d),
                              stream);
}

template <int D>
size_t SharedBytes(ElementType type, int block_rows) {
  if (type == ElementType::kFloat32) {
    return sizeof(float) *
           ((block_rows + kBlockKeys) * (D + 8) + kBlockKeys * (D + 4));
  }
  return 2 * (block_rows + 2 * kBlockKeys) * (D + 8);
}

template <int D, int kWarps>
cudaError_t LaunchForShape(const FusedAttentionArgs& args,
                           cudaStream_t stream) {
  const size_t shared = SharedBytes<D>(args.type, kWarps * 16);
  switch (args.type) {
    case ElementType::kFloat32:
      return Launch<kWarps>(FusedAttentionF32<D, kWarps>, shared, args, stream);
    case ElementType::kBFloat16:
      return Launch<kWarps>(FusedAttention16<__nv_bfloat16, D, kWarps>, shared,
                            args, stream);
    case ElementType::kFloat16:
      return Launch<kWarps>(FusedAttention16<__half, D, kWarps>, shared, args,
                            stream);
  }
  return cudaErrorInvalidValue;
}

template <int D>
cudaError_t LaunchForHeadDim(const FusedAttentionArgs& args,
                             cudaStream_t stream) {
  return args.block_rows == 16 ? LaunchForShape<D, 1>(args, stream)
                               : LaunchForShape<D, 4>(args, stream);
}

size_t SharedBytesFor(int64_t d, ElementType type, int block_rows) {
  switch (d) {
    case 32:
      return SharedBytes<32>(type, block_rows);
    case 64:
      return SharedBytes<64>(type, block_rows);
    default:
      return SharedBytes<128>(type, block_rows);
  }
}

}  // namespace

cudaError_t LaunchMergeKeySplits(const float* partial_out,
                                 const float* partial_stats, float* out,
                                 int64_t rows, int splits, int d,
                                 cudaStream_t stream) {
  if (rows < 1 || rows > 0x7fffffff || splits < 1 ||
      !FusedAttentionSupportsHeadDim(d)) {
    return cudaErrorInvalidConfiguration;
  }
  MergeKeySplits<<<static_cast<unsigned>(rows), kMergeWarps * 32, 0, stream>>>(
      partial_out, partial_stats, out, rows, splits, d);
  return cudaGetLastError();
}

bool FusedAttentionSupportsHeadDim(int64_t d) {
  return d == 32 || d == 64 || d == 128;
}

FusedAttentionPlan PlanFusedAttention(const FusedAttentionArgs& args,
                                      int multiprocessors,
                                      int64_t shared_per_multiprocessor) {
  FusedAttentionPlan plan;
  // One warp's 16 rows when a (batch, head) has no more: a 64-row block
  // would spend its tensor cores on 48 empty rows.
  plan.block_rows = args.lq <= 16 ? 16 : 64;
  const int64_t key_tiles = (args.lk + kBlockKeys - 1) / kBlockKeys;
  plan.tiles_per_split = key_tiles;
  const int64_t blocks =
      args.batch * args.heads * ((args.lq + plan.block_rows - 1) / plan.block_rows);
  const int64_t shared =
      static_cast<int64_t>(SharedBytesFor(args.d, args.type, plan.block_rows));
  const int64_t per_multiprocessor = std::max<int64_t>(
      1, std::min<int64_t>(16, shared_per_multiprocessor / (shared + 1024)));
  const int64_t resident = per_multiprocessor * multiprocessors;
  if (blocks >= resident || key_tiles < 8) return plan;
  // One wave of resident blocks (a second would double the partials to
  // merge), each split at least 4 tiles (256 keys),
  // and the partial rows (splits x lq) at most a quarter of the key rows,
  // so that they stay small beside the keys they summarise (and device
  // memory stays linear in the length).
  const int64_t wanted = (resident + blocks - 1) / blocks;
  const int64_t splits = std::min<int64_t>(
      {wanted, key_tiles / 4, args.lk / (4 * args.lq), int64_t{65535}});
  if (splits < 2) return plan;
  plan.tiles_per_split = (key_tiles + splits - 1) / splits;
  plan.key_splits =
      static_cast<int>((key_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split);
  return plan;
}

cudaError_t LaunchFusedAttention(const FusedAttentionArgs& args,
                                 cudaStream_t stream) {
  if (args.block_rows != 16 && args.block_rows != 64) {
    return cudaErrorInvalidValue;
  }
  if (args.key_splits > 1 &&
      (args.partial_out == nullptr || args.partial_stats == nullptr)) {
    return cudaErrorInvalidValue;
  }
  switch (args.d) {
    case 32:
      return LaunchForHeadDim<32>(args, stream);
    case 64:
      return LaunchForHeadDim<64>(args, stream);
    case 128:
      return LaunchForHeadDim<128>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attn::cuda_internal
