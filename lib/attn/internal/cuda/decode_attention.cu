// Few query rows (at most 4 per batch entry and head) over many keys, with
// no mask: a stored memory's lone queries. Reading the keys and values once
// at the memory's bandwidth is the whole cost, so this kernel streams them
// with 16-byte loads, eight steps of them in flight per lane, and computes
// on the CUDA cores in float32 (no tensor-core tile to fill with empty
// rows, and float32 products without splitting operands).
//
// A warp's lanes are cut into groups of D / (16 / sizeof(T)) lanes, one
// key per group per step, each lane holding 16 bytes of the key's row (and
// of its value row) and that slice of every query row and output row. Each
// group keeps its own online softmax (running max m, in log2 units, and sum
// l); the groups of a warp, then the warps of a block, are merged by their
// log-sum-exp, and each block writes its rows' partials for
// MergeKeySplits, one split per block (attn/internal/cuda/kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attn/internal/cuda/kernels.h"

namespace attn::cuda_internal {
namespace {

constexpr int kWarps = 4;
constexpr int kSteps = 8;  // steps of loads in flight per lane
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// 16 bytes of T as floats.
template <typename T>
struct Vector;
template <>
struct Vector<float> {
  static constexpr int kCount = 4;
  static __device__ __forceinline__ void Widen(const uint4& raw, float* out) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  }
};
template <>
struct Vector<__nv_bfloat16> {
  static constexpr int kCount = 8;
  static __device__ __forceinline__ void Widen(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};
template <>
struct Vector<__half> {
  static constexpr int kCount = 8;
  static __device__ __forceinline__ void Widen(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 pair = *reinterpret_cast<const __half2*>(&words[i]);
      const float2 f = __half22float2(pair);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

// Folds (m_o, l_o, acc_o) into (m, l, acc): both are partial softmaxes of
// the same row over disjoint keys.
template <int kCount>
__device__ __forceinline__ void MergeInto(float& m, float& l, float (&acc)[kCount],
                                          float m_o, float l_o,
                                          const float (&acc_o)[kCount]) {
  const float m_new = fmaxf(m, m_o);
  // Both empty: stays empty (exp2(-inf - -inf) would be NaN).
  const float m_ref = m_new == kNegInf ? 0.0f : m_new;
  const float a = exp2f(m - m_ref), b = exp2f(m_o - m_ref);
  m = m_new;
  l = l * a + l_o * b;
#pragma unroll
  for (int e = 0; e < kCount; ++e) acc[e] = acc[e] * a + acc_o[e] * b;
}

template <typename T, int D, int R>
__global__ void __launch_bounds__(kWarps * 32)
    DecodeAttention(DecodeAttentionArgs a) {
  using V = Vector<T>;
  constexpr int kCount = V::kCount;
  constexpr int kLanesPerKey = D / kCount;
  constexpr int kGroups = 32 / kLanesPerKey;  // keys per warp step
  static_assert(kLanesPerKey >= 1 && kLanesPerKey <= 32 &&
                32 % kLanesPerKey == 0, "D must be 32, 64 or 128");
  __shared__ float shared_stats[kWarps][R][2];
  __shared__ float shared_acc[kWarps][R][D];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / kLanesPerKey, sub = lane % kLanesPerKey;
  const int64_t bh = blockIdx.y;
  const T* q = static_cast<const T*>(a.q) + bh * a.lq * D;
  const T* k = static_cast<const T*>(a.k) + bh * a.lk * D;
  const T* v = static_cast<const T*>(a.v) + bh * a.lk * D;
  const int rows = static_cast<int>(a.lq);  // <= R

  // The block's keys, then each warp's contiguous share of them.
  const int64_t block_begin = blockIdx.x * a.keys_per_split;
  const int64_t block_end = min(block_begin + a.keys_per_split, a.lk);
  const int64_t per_warp = (block_end - block_begin + kWarps - 1) / kWarps;
  const int64_t begin = min(block_begin + warp * per_warp, block_end);
  const int64_t end = min(begin + per_warp, block_end);

  float q_slice[R][kCount];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r < rows) {
      const uint4 raw =
          *reinterpret_cast<const uint4*>(q + r * D + sub * kCount);
      V::Widen(raw, q_slice[r]);
    } else {
#pragma unroll
      for (int e = 0; e < kCount; ++e) q_slice[r][e] = 0.0f;
    }
  }
  const float scale_log2 = a.scale * kLog2e;
  float m[R], l[R], acc[R][kCount];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < kCount; ++e) acc[r][e] = 0.0f;
  }

  for (int64_t key0 = begin; key0 < end; key0 += kSteps * kGroups) {
    uint4 k_raw[kSteps], v_raw[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t key = key0 + s * kGroups + group;
      if (key < end) {
        k_raw[s] = __ldg(reinterpret_cast<const uint4*>(k + key * D + sub * kCount));
        v_raw[s] = __ldg(reinterpret_cast<const uint4*>(v + key * D + sub * kCount));
      } else {
        k_raw[s] = v_raw[s] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const bool valid = key0 + s * kGroups + group < end;
      float key[kCount], value[kCount];
      V::Widen(k_raw[s], key);
      V::Widen(v_raw[s], value);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) continue;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kCount; ++e) dot = fmaf(q_slice[r][e], key[e], dot);
#pragma unroll
        for (int offset = kLanesPerKey / 2; offset > 0; offset /= 2) {
          dot += __shfl_xor_sync(0xffffffff, dot, offset);
        }
        const float score = valid ? dot * scale_log2 : kNegInf;
        const float m_new = fmaxf(m[r], score);
        const float m_ref = m_new == kNegInf ? 0.0f : m_new;
        const float alpha = exp2f(m[r] - m_ref);
        const float p = exp2f(score - m_ref);
        m[r] = m_new;
        l[r] = l[r] * alpha + p;
#pragma unroll
        for (int e = 0; e < kCount; ++e) {
          acc[r][e] = fmaf(p, value[e], acc[r][e] * alpha);
        }
      }
    }
  }

  // The warp's groups into group 0, then the block's warps into warp 0.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
      const float m_o = __shfl_xor_sync(0xffffffff, m[r], offset);
      const float l_o = __shfl_xor_sync(0xffffffff, l[r], offset);
      float acc_o[kCount];
#pragma unroll
      for (int e = 0; e < kCount; ++e) {
        acc_o[e] = __shfl_xor_sync(0xffffffff, acc[r][e], offset);
      }
      MergeInto<kCount>(m[r], l[r], acc[r], m_o, l_o, acc_o);
    }
    if (group == 0 && r < rows) {
      if (sub == 0) {
        shared_stats[warp][r][0] = m[r];
        shared_stats[warp][r][1] = l[r];
      }
#pragma unroll
      for (int e = 0; e < kCount; ++e) shared_acc[warp][r][sub * kCount + e] = acc[r][e];
    }
  }
  __syncthreads();
  const int64_t all_rows = a.batch * a.heads * a.lq;
  for (int i = threadIdx.x; i < rows * D; i += kWarps * 32) {
    const int r = i / D, c = i % D;
    float mm = kNegInf;
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, shared_stats[w][r][0]);
    const float m_ref = mm == kNegInf ? 0.0f : mm;
    float sum = 0.0f, value = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(shared_stats[w][r][0] - m_ref);
      sum += weight * shared_stats[w][r][1];
      value += weight * shared_acc[w][r][c];
    }
    const int64_t at = blockIdx.x * all_rows + bh * a.lq + r;
    a.partial_out[at * D + c] = value;
    if (c == 0) {
      a.partial_stats[2 * at] = mm;
      a.partial_stats[2 * at + 1] = sum;
    }
  }
}

template <typename T, int D>
cudaError_t LaunchRows(const DecodeAttentionArgs& a, dim3 grid,
                       cudaStream_t stream) {
  if (a.lq <= 1) {
    DecodeAttention<T, D, 1><<<grid, kWarps * 32, 0, stream>>>(a);
  } else if (a.lq <= 2) {
    DecodeAttention<T, D, 2><<<grid, kWarps * 32, 0, stream>>>(a);
  } else {
    DecodeAttention<T, D, 4><<<grid, kWarps * 32, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchType(const DecodeAttentionArgs& a, dim3 grid,
                       cudaStream_t stream) {
  switch (a.d) {
    case 32:
      return LaunchRows<T, 32>(a, grid, stream);
    case 64:
      return LaunchRows<T, 64>(a, grid, stream);
    case 128:
      return LaunchRows<T, 128>(a, grid, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool DecodeAttentionTakes(int64_t lq, int64_t d) {
  return lq >= 1 && lq <= kDecodeMaxRows && (d == 32 || d == 64 || d == 128);
}

int64_t PlanDecodeAttention(const DecodeAttentionArgs& args,
                            int multiprocessors) {
  // About one wave of blocks at four per SM (a block's 4 warps keep 8
  // steps of loads each in flight), each at least 256 keys: fewer splits
  // leave SMs idle, more leave more partials to merge.
  const int64_t wanted = std::max<int64_t>(
      1, std::min<int64_t>(int64_t{4} * multiprocessors / (args.batch * args.heads),
                           args.lk / 256));
  const int64_t splits = std::min<int64_t>(wanted, 65535);
  // Whole multiples of 8 keys, so every block's first key row stays
  // 16-byte aligned whatever the element size.
  int64_t keys = (args.lk + splits - 1) / splits;
  keys = (keys + 7) / 8 * 8;
  return keys;
}

cudaError_t LaunchDecodeAttention(const DecodeAttentionArgs& a,
                                  cudaStream_t stream) {
  if (!DecodeAttentionTakes(a.lq, a.d) || a.keys_per_split < 8 ||
      a.keys_per_split % 8 != 0 || a.partial_out == nullptr ||
      a.partial_stats == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t splits = (a.lk + a.keys_per_split - 1) / a.keys_per_split;
  const int64_t bh = a.batch * a.heads;
  if (splits > 0x7fffffff || bh > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(bh));
  cudaError_t status;
  switch (a.type) {
    case ElementType::kFloat32:
      status = LaunchType<float>(a, grid, stream);
      break;
    case ElementType::kBFloat16:
      status = LaunchType<__nv_bfloat16>(a, grid, stream);
      break;
    case ElementType::kFloat16:
      status = LaunchType<__half>(a, grid, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (status != cudaSuccess) return status;
  return LaunchMergeKeySplits(a.partial_out, a.partial_stats, a.out,
                              bh * a.lq, static_cast<int>(splits),
                              static_cast<int>(a.d), stream);
}

}  // namespace attn::cuda_internal
