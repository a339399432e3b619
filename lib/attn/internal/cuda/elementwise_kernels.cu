// The CUDA kernels other than fused attention: masked softmax, operand
// conversion, the Gaussian, additive and regression scores, and row
// normalisation. All are memory- or transcendental-bound; they favour
// obvious indexing over cleverness.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attn/internal/cuda/kernels.h"

namespace attn::cuda_internal {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
  }
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffff, x, offset);
  }
  return x;
}

bool GridFor(int64_t warps, unsigned* blocks) {
  const int64_t count = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (count <= 0 || count > 0x7fffffff) return false;
  *blocks = static_cast<unsigned>(count);
  return true;
}

// One warp per row (rows can be long: each lane strides the columns).
__global__ void MaskedSoftmaxKernel(const float* x, float* out, int64_t batch,
                                    int64_t heads, int64_t rows,
                                    int64_t columns, KeyLimits limits) {
  const int64_t row_index =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row_index >= batch * heads * rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t row = row_index % rows;
  const int64_t b = row_index / (heads * rows);
  int64_t limit = columns;
  if (limits.kind == KeyLimits::kPerBatch) limit = limits.valid[b];
  if (limits.kind == KeyLimits::kPerRow) limit = limits.valid[b * rows + row];
  if (limits.causal) limit = min(limit, row + 1);

  const float* in_row = x + row_index * columns;
  float* out_row = out + row_index * columns;
  float max_value = kNegInf;
  for (int64_t j = lane; j < limit; j += 32) max_value = fmaxf(max_value, in_row[j]);
  max_value = WarpMax(max_value);
  float sum = 0.0f;
  for (int64_t j = lane; j < limit; j += 32) sum += expf(in_row[j] - max_value);
  sum = WarpSum(sum);
  const float inv = limit > 0 ? 1.0f / sum : 0.0f;
  for (int64_t j = lane; j < columns; j += 32) {
    out_row[j] = j < limit ? expf(in_row[j] - max_value) * inv : 0.0f;
  }
}

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

template <typename T>
__global__ void ConvertKernel(const float* in, T* out, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(in[i]);
  }
}

// A 16 x 16 tile of a (rows_a, cols_b) pairwise score per block, the inner
// dimension staged through shared memory 16 at a time. Pair(acc, a, b)
// accumulates one term; Finish(acc) gives the score.
constexpr int kTile = 16;

template <typename Pair, typename Finish>
__device__ void PairwiseTile(const float* a, const float* b, float* out,
                             int64_t rows_a, int64_t rows_b, int64_t inner,
                             Pair pair, Finish finish) {
  __shared__ float a_tile[kTile][kTile + 1];
  __shared__ float b_tile[kTile][kTile + 1];
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  const int64_t b_row = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.y;
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < inner; c0 += kTile) {
    const int64_t c = c0 + threadIdx.x;
    a_tile[threadIdx.y][threadIdx.x] =
        i < rows_a && c < inner ? a[i * inner + c] : 0.0f;
    b_tile[threadIdx.y][threadIdx.x] =
        b_row < rows_b && c < inner ? b[b_row * inner + c] : 0.0f;
    __syncthreads();
    const int64_t span = inner - c0 < kTile ? inner - c0 : kTile;
    for (int cc = 0; cc < span; ++cc) {
      acc = pair(acc, a_tile[threadIdx.y][cc], b_tile[threadIdx.x][cc], c0 + cc);
    }
    __syncthreads();
  }
  if (i < rows_a && j < rows_b) out[i * rows_b + j] = finish(acc);
}

__global__ void GaussianScoresKernel(const float* q, const float* k,
                                     float* scores, int64_t lq, int64_t lk,
                                     int64_t d, float scale) {
  const int64_t bh = blockIdx.z;
  PairwiseTile(
      q + bh * lq * d, k + bh * lk * d, scores + bh * lq * lk, lq, lk, d,
      [](float acc, float x, float y, int64_t) {
        const float diff = x - y;
        return fmaf(diff, diff, acc);
      },
      [scale](float acc) { return -0.5f * scale * acc; });
}

__global__ void AdditiveScoresKernel(const float* qp, const float* kp,
                                     const float* w_v, float* scores,
                                     int64_t lq, int64_t lk, int64_t h) {
  const int64_t b = blockIdx.z;
  PairwiseTile(
      qp + b * lq * h, kp + b * lk * h, scores + b * lq * lk, lq, lk, h,
      [w_v](float acc, float x, float y, int64_t c) {
        return fmaf(w_v[c], tanhf(x + y), acc);
      },
      [](float acc) { return acc; });
}

// RegressionKernel's values: 0 Gaussian, 1 boxcar, 2 constant, 3 Epanechnikov.
__global__ void RegressionScoresKernel(const float* x_query,
                                       const float* x_train, float* out,
                                       int64_t n_query, int64_t n_train,
                                       int64_t dx, int kernel,
                                       float bandwidth) {
  PairwiseTile(
      x_query, x_train, out, n_query, n_train, dx,
      [](float acc, float x, float y, int64_t) {
        const float diff = x - y;
        return fmaf(diff, diff, acc);
      },
      [kernel, bandwidth](float squared_distance) {
        const float u = bandwidth * sqrtf(squared_distance);
        switch (kernel) {
          case 0:
            return -0.5f * u * u;
          case 1:
            return u < 1.0f ? 1.0f : 0.0f;
          case 2:
            return 1.0f;
          default:
            return fmaxf(0.0f, 1.0f - u);
        }
      });
}

__global__ void NormalizeRowsKernel(float* w, int64_t rows, int64_t columns) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float* values = w + row * columns;
  float sum = 0.0f;
  for (int64_t j = lane; j < columns; j += 32) sum += values[j];
  sum = WarpSum(sum);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int64_t j = lane; j < columns; j += 32) values[j] *= inv;
}

bool PairwiseGrid(int64_t rows_a, int64_t rows_b, int64_t depth, dim3* grid) {
  const int64_t x = (rows_b + kTile - 1) / kTile;
  const int64_t y = (rows_a + kTile - 1) / kTile;
  if (x <= 0 || y <= 0 || depth <= 0 || x > 0x7fffffff || y > 65535 ||
      depth > 65535) {
    return false;
  }
  *grid = dim3(static_cast<unsigned>(x), static_cast<unsigned>(y),
               static_cast<unsigned>(depth));
  return true;
}

}  // namespace

cudaError_t LaunchMaskedSoftmax(const float* x, float* out, int64_t batch,
                                int64_t heads, int64_t rows, int64_t columns,
                                KeyLimits limits, cudaStream_t stream) {
  unsigned blocks;
  if (!GridFor(batch * heads * rows, &blocks)) return cudaErrorInvalidConfiguration;
  MaskedSoftmaxKernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
      x, out, batch, heads, rows, columns, limits);
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const float* in, void* out, int64_t count,
                          ElementType to, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const unsigned blocks =
      static_cast<unsigned>((count + 255) / 256 < 65536 ? (count + 255) / 256 : 65536);
  switch (to) {
    case ElementType::kBFloat16:
      ConvertKernel<<<blocks, 256, 0, stream>>>(
          in, static_cast<__nv_bfloat16*>(out), count);
      break;
    case ElementType::kFloat16:
      ConvertKernel<<<blocks, 256, 0, stream>>>(
          in, static_cast<__half*>(out), count);
      break;
    case ElementType::kFloat32:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchGaussianScores(const float* q, const float* k,
                                 float* scores, int64_t bh, int64_t lq,
                                 int64_t lk, int64_t d, float scale,
                                 cudaStream_t stream) {
  dim3 grid;
  if (!PairwiseGrid(lq, lk, bh, &grid)) return cudaErrorInvalidConfiguration;
  GaussianScoresKernel<<<grid, dim3(kTile, kTile), 0, stream>>>(
      q, k, scores, lq, lk, d, scale);
  return cudaGetLastError();
}

cudaError_t LaunchAdditiveScores(const float* qp, const float* kp,
                                 const float* w_v, float* scores,
                                 int64_t batch, int64_t lq, int64_t lk,
                                 int64_t h, cudaStream_t stream) {
  dim3 grid;
  if (!PairwiseGrid(lq, lk, batch, &grid)) return cudaErrorInvalidConfiguration;
  AdditiveScoresKernel<<<grid, dim3(kTile, kTile), 0, stream>>>(
      qp, kp, w_v, scores, lq, lk, h);
  return cudaGetLastError();
}

cudaError_t LaunchRegressionScores(const float* x_query, const float* x_train,
                                   float* out, int64_t n_query,
                                   int64_t n_train, int64_t dx, int kernel,
                                   float bandwidth, cudaStream_t stream) {
  dim3 grid;
  if (!PairwiseGrid(n_query, n_train, 1, &grid)) {
    return cudaErrorInvalidConfiguration;
  }
  RegressionScoresKernel<<<grid, dim3(kTile, kTile), 0, stream>>>(
      x_query, x_train, out, n_query, n_train, dx, kernel, bandwidth);
  return cudaGetLastError();
}

cudaError_t LaunchNormalizeRows(float* w, int64_t rows, int64_t columns,
                                cudaStream_t stream) {
  unsigned blocks;
  if (!GridFor(rows, &blocks)) return cudaErrorInvalidConfiguration;
  NormalizeRowsKernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(w, rows,
                                                                 columns);
  return cudaGetLastError();
}

}  // namespace attn::cuda_internal
