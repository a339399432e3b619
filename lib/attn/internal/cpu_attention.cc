// Blocked CPU attention (dot-product, Gaussian-score and additive) and the
// masked softmax rows they share.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <oneapi/dnnl/dnnl.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu_kernels_impl.h"
#include "attn/internal/isa.h"
#include "attn/work.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/lane_attention.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// Rows of queries one task owns, and keys per online-softmax step: a
// 128 x 256 score block, a 256-row key block, a 256-row value block and the
// 128-row accumulator stay inside a 512 KiB L2 for d, dv <= 128. 128 rows
// rather than 64: brgemm re-packs a key block for every product, and 128
// rows halve that (4-8% faster at full work, AMD EPYC with AVX-512; causal
// masks skip at a coarser grain, ~equal).
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 256;
// Keys from which a call counts as over many keys (a stored memory's): the
// lane kernel and compiled block shapes for fewer rows than a query block.
constexpr int64_t kCompiledKeys = 16 * kKeyBlock;

// Row-major C = alpha * A * op(B) + beta * C on one thread (inside an OpenMP
// region oneDNN's sgemm runs sequentially; outside one, callers have set the
// thread count). Returns false if oneDNN reports a failure.
bool Gemm(bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  return dnnl_sgemm('N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                    ldb, beta, c, ldc) == dnnl_success;
}

// Runs body(task) for task in [0, tasks) on `threads` OpenMP threads, with
// dynamic scheduling (causal and valid-length masks make tasks uneven).
template <typename Body>
void ParallelFor(int64_t tasks, int threads, const Body& body) {
  if (threads <= 1 || tasks <= 1) {
    for (int64_t task = 0; task < tasks; ++task) body(task);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) body(task);
}

// What the attention products read: the float32 inputs, or bfloat16 copies
// of them (or keys and values held as bfloat16).
struct Operands {
  BlockOperands type = BlockOperands::kFloat32;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  // bfloat16 products widened a block at a time whatever their shape: keys
  // and values held as bfloat16 on a CPU without bfloat16 products, which
  // would otherwise need the whole memory widened for every call.
  bool own_products = false;
  // bfloat16 products that the lane kernel may run (lane_attention.h): the
  // CPU multiplies bfloat16 in hardware, not on AMX tiles, where oneDNN's
  // products are not measured against it.
  bool lane_bfloat16 = false;

  int64_t ElementBytes() const {
    return type == BlockOperands::kBFloat16 ? 2 : 4;
  }
  // &base[index] for a base of this operand type.
  const void* At(const void* base, int64_t index) const {
    return static_cast<const char*>(base) + index * ElementBytes();
  }
  // Element `index` of `base`, widened to float.
  float Load(const void* base, int64_t index) const {
    return type == BlockOperands::kBFloat16
               ? FromBFloat16(static_cast<const uint16_t*>(base)[index])
               : static_cast<const float*>(base)[index];
  }
};

// bfloat16 products with at most this many rows run on BFloat16Product
// (one row on vector loops over the bits, more widened to float32 for
// sgemm): oneDNN binds a run-time-shaped bfloat16 primitive per key block,
// microseconds that a single query's block (1 x 256 x 64) does not repay.
constexpr int64_t kFewRows = 4;

// Widens `rows` rows of `cols` bfloat16 values (row stride `ld`) into
// `to`, packed.
void Widen(const uint16_t* from, int64_t rows, int64_t cols, int64_t ld,
           float* to) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = from + r * ld;
    float* out = to + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] = FromBFloat16(row[c]);
  }
}

// Sixteen floats, or their bits, as one vector (GCC's vector extension:
// one register with AVX-512, two or four elsewhere), so that partial sums
// stay in registers; written as plain loops, they went through memory at
// every key.
using Floats16 = float __attribute__((vector_size(64)));
using Words16 = uint32_t __attribute__((vector_size(64)));
using Halves16 = uint16_t __attribute__((vector_size(32)));

// Sixteen bfloat16 values at `bits`, widened into `floats` (an out
// parameter: a vector return would depend on the instruction set's ABI).
inline void LoadBFloat16x16(const uint16_t* bits, Floats16& floats) {
  Halves16 halves;
  std::memcpy(&halves, bits, sizeof(halves));
  const Words16 words = __builtin_convertvector(halves, Words16) << 16;
  std::memcpy(&floats, &words, sizeof(floats));
}

// The sum of the sixteen lanes: halves folded onto each other, four
// shuffles instead of fifteen dependent additions.
// (By reference: a vector argument's passing depends on the instruction
// set.)
inline float SumOfLanes(const Floats16& lanes) {
  Floats16 sums = lanes;
  // __builtin_shufflevector: GCC (12 on) and Clang alike.
  sums += __builtin_shufflevector(sums, sums, 8, 9, 10, 11, 12, 13, 14, 15, 0,
                                  1, 2, 3, 4, 5, 6, 7);
  sums += __builtin_shufflevector(sums, sums, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13,
                                  14, 15, 8, 9, 10, 11);
  sums += __builtin_shufflevector(sums, sums, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8,
                                  9, 14, 15, 12, 13);
  sums += __builtin_shufflevector(sums, sums, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11,
                                  10, 13, 12, 15, 14);
  return sums[0];
}

// c[n] (+)= sum_k a[k] b[n][k] for `keys` rows of b (row stride ldb), each a
// dot product of `depth` bfloat16 pairs in float32; four keys at a time, so
// that four chains of fused multiply-adds overlap.
inline void BFloat16Dots(const uint16_t* a, const uint16_t* b, int64_t keys,
                         int64_t depth, int64_t ldb, bool accumulate,
                         float* c) {
  const int64_t whole = depth / 16 * 16;
  auto tail = [&](const uint16_t* row) {
    float sum = 0.0f;
    for (int64_t k = whole; k < depth; ++k) {
      sum += FromBFloat16(a[k]) * FromBFloat16(row[k]);
    }
    return sum;
  };
  int64_t n = 0;
  for (; n + 4 <= keys; n += 4) {
    const uint16_t* rows[4] = {b + n * ldb, b + (n + 1) * ldb,
                               b + (n + 2) * ldb, b + (n + 3) * ldb};
    Floats16 sums[4] = {};
    for (int64_t k = 0; k < whole; k += 16) {
      Floats16 x;
      LoadBFloat16x16(a + k, x);
      for (int r = 0; r < 4; ++r) {
        Floats16 y;
        LoadBFloat16x16(rows[r] + k, y);
        sums[r] += x * y;
      }
    }
    for (int r = 0; r < 4; ++r) {
      const float sum = SumOfLanes(sums[r]) + tail(rows[r]);
      c[n + r] = accumulate ? c[n + r] + sum : sum;
    }
  }
  for (; n < keys; ++n) {
    const uint16_t* row = b + n * ldb;
    Floats16 sums = {};
    for (int64_t k = 0; k < whole; k += 16) {
      Floats16 x, y;
      LoadBFloat16x16(a + k, x);
      LoadBFloat16x16(row + k, y);
      sums += x * y;
    }
    const float sum = SumOfLanes(sums) + tail(row);
    c[n] = accumulate ? c[n] + sum : sum;
  }
}

// c[n] (+)= sum_k p[k] v[k][n] for one row of bfloat16 probabilities `p`
// and bfloat16 rows of `v` (row stride ldv): 64 columns at a time (four
// independent sums) over all of the keys, then 16, then one.
inline void BFloat16RowTimes(const uint16_t* p, const uint16_t* v,
                             int64_t keys, int64_t columns, int64_t ldv,
                             bool accumulate, float* c) {
  int64_t n0 = 0;
  for (; n0 + 64 <= columns; n0 += 64) {
    Floats16 sums[4] = {};
    if (accumulate) std::memcpy(sums, c + n0, sizeof(sums));
    for (int64_t k = 0; k < keys; ++k) {
      if (p[k] == 0) continue;  // masked or vanished probabilities
      const float weight = FromBFloat16(p[k]);
      for (int r = 0; r < 4; ++r) {
        Floats16 row;
        LoadBFloat16x16(v + k * ldv + n0 + 16 * r, row);
        sums[r] += weight * row;
      }
    }
    std::memcpy(c + n0, sums, sizeof(sums));
  }
  for (; n0 + 16 <= columns; n0 += 16) {
    Floats16 sums = {};
    if (accumulate) std::memcpy(&sums, c + n0, sizeof(sums));
    for (int64_t k = 0; k < keys; ++k) {
      if (p[k] == 0) continue;
      Floats16 row;
      LoadBFloat16x16(v + k * ldv + n0, row);
      sums += FromBFloat16(p[k]) * row;
    }
    std::memcpy(c + n0, &sums, sizeof(sums));
  }
  for (int64_t n = n0; n < columns; ++n) {
    float sum = accumulate ? c[n] : 0.0f;
    for (int64_t k = 0; k < keys; ++k) {
      sum += FromBFloat16(p[k]) * FromBFloat16(v[k * ldv + n]);
    }
    c[n] = sum;
  }
}

// `product` with bfloat16 operands: for one row, plain loops; for more, sgemm
// on them widened to float32 a chunk of at most 256 along the long dimension
// (the keys) at a time. Every product is exact in float32 (two 8-bit
// significands make at most 16 bits) and the sums are float32, the
// arithmetic of the bfloat16 hardware in another order of summation, which
// the error bounds allow.
bool BFloat16Product(const BlockProduct& product, const uint16_t* a,
                     const uint16_t* b, float* c) {
  if (product.m == 1) {
    // One query: the widening would cost what the halved read saves, so
    // plain loops read the bfloat16 values where they lie.
    if (product.transpose_b) {  // c[n] (+)= sum_k a[k] b[n][k]
      BFloat16Dots(a, b, product.n, product.k, product.ldb,
                   product.accumulate, c);
      return true;
    }
    BFloat16RowTimes(a, b, product.k, product.n, product.ldb,
                     product.accumulate, c);  // c[n] (+)= sum_k a[k] b[k][n]
    return true;
  }
  constexpr int64_t kChunk = 256;
  thread_local std::vector<float> wide_a, wide_b;
  const int64_t m = product.m, n = product.n, k = product.k;
  auto sgemm = [&](char transpose_b, int64_t cols, int64_t depth,
                   const float* x, const float* y, int64_t ldy, float beta,
                   float* out) {
    return dnnl_sgemm('N', transpose_b, m, cols, depth, 1.0f, x, depth, y,
                      ldy, beta, out, product.ldc) == dnnl_success;
  };
  if (product.transpose_b) {  // c[m][n] (+)= sum_k a[m][k] b[n][k]
    wide_a.resize(m * k);
    Widen(a, m, k, product.lda, wide_a.data());
    for (int64_t n0 = 0; n0 < n; n0 += kChunk) {
      const int64_t cols = std::min(kChunk, n - n0);
      wide_b.resize(cols * k);
      Widen(b + n0 * product.ldb, cols, k, product.ldb, wide_b.data());
      if (!sgemm('T', cols, k, wide_a.data(), wide_b.data(), k,
                 product.accumulate ? 1.0f : 0.0f, c + n0)) {
        return false;
      }
    }
    return true;
  }
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {  // c (+)= a b, k in chunks
    const int64_t depth = std::min(kChunk, k - k0);
    wide_a.resize(m * depth);
    Widen(a + k0, m, depth, product.lda, wide_a.data());
    wide_b.resize(depth * n);
    Widen(b + k0 * product.ldb, depth, n, product.ldb, wide_b.data());
    const float beta = k0 > 0 || product.accumulate ? 1.0f : 0.0f;
    if (!sgemm('N', n, depth, wide_a.data(), wide_b.data(), n, beta, c)) {
      return false;
    }
  }
  return true;
}

// One block product of the attention kernel: widened to float32 for
// bfloat16 operands with few rows (or Operands::own_products), else oneDNN's.
bool Product(const Operands& ops, const BlockProduct& product, bool recurring,
             const void* a, const void* b, float* c) {
  if (product.operands == BlockOperands::kBFloat16 &&
      (ops.own_products || product.m <= kFewRows)) {
    return BFloat16Product(product, static_cast<const uint16_t*>(a),
                           static_cast<const uint16_t*>(b), c);
  }
  return RunBlockProduct(product, recurring, a, b, c);
}

// Gaussian score: -scale * ||q - k||^2 / 2 = scale * (q.k - ||k||^2 / 2 -
// ||q||^2 / 2). The last term is constant along a softmax row, so it is
// dropped; half the key's squared norm is subtracted from each raw dot
// product (the scale is applied in the exponential's argument).
void SubtractKeyNorms(const Operands& ops, const void* keys, int64_t count,
                      int64_t d, float* scores, int64_t rows, int64_t ld,
                      float* norms) {
  for (int64_t j = 0; j < count; ++j) {
    float sum = 0.0f;
    for (int64_t c = 0; c < d; ++c) {
      const float x = ops.Load(keys, j * d + c);
      sum += x * x;
    }
    norms[j] = 0.5f * sum;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) row[j] -= norms[j];
  }
}

// Per-thread buffers, sized for the call (a toy call must not pay for
// full-size blocks).
struct Scratch {
  int64_t key_block = 0;       // min(kKeyBlock, lk): the row stride of scores
  std::vector<float> scores;   // query block x key_block
  std::vector<uint16_t> rounded;  // bfloat16 probabilities: scores' shape,
                                  // or query block x lk with weights
  std::vector<float> acc;      // kQueryBlock x dv
  std::vector<float> max;      // kQueryBlock
  std::vector<float> sum;      // kQueryBlock
  std::vector<float> norms;    // key_block
  std::vector<int64_t> limit;  // kQueryBlock
  LaneScratch lanes;
};

// A share of one task's keys, [begin, end) with begin a multiple of
// kKeyBlock, for calls with fewer tasks than threads: the share leaves each
// row's raw-score max, sum of exponentials and unnormalised output in
// max, sum and acc (kQueryBlock, kQueryBlock, kQueryBlock x dv), and
// MergeKeyShares combines them.
struct KeyShare {
  int64_t begin = 0;
  int64_t end = 0;
  float* max = nullptr;
  float* sum = nullptr;
  float* acc = nullptr;
};

// One (batch, head, query block) task of the online-softmax kernel, over
// all its keys or over `share` of them. Scores are raw dot products (minus
// half the key norms for the Gaussian score); the scale enters in the
// exponentials.
bool FusedBlock(const AttentionParams& p, const Operands& ops, int64_t bh,
                int64_t q0, int64_t rows, Scratch& s,
                const KeyShare* share = nullptr) {
  const int64_t b = bh / p.heads;
  const void* q = ops.At(ops.q, (bh * p.lq + q0) * p.d);
  const void* k = ops.At(ops.k, bh * p.lk * p.d);
  const void* v = ops.At(ops.v, bh * p.lk * p.dv);
  float* out = p.out + (bh * p.lq + q0) * p.dv;
  const bool bf16 = ops.type == BlockOperands::kBFloat16;

  int64_t key_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    s.limit[r] = p.KeyLimit(b, q0 + r);
    key_end = std::max(key_end, s.limit[r]);
  }
  const int64_t key_begin = share != nullptr ? share->begin : 0;
  const int64_t scan_end =
      share != nullptr ? std::min(key_end, share->end) : key_end;
  // A few rows over many keys (a stored memory's batched queries): the lane
  // kernel reads each key block once, in place, under the arithmetic.
  if ((!bf16 || ops.lane_bfloat16) &&
      LaneAttentionTakes(rows, key_end, p.d, p.dv, bf16, kCompiledKeys)) {
    LanePass pass;
    pass.q = q;
    pass.k = k;
    pass.v = v;
    pass.bfloat16 = bf16;
    pass.out = out;
    pass.rows = rows;
    pass.d = p.d;
    pass.dv = p.dv;
    pass.key_begin = key_begin;
    pass.key_end = scan_end;
    pass.limits = s.limit.data();
    if (share != nullptr) {
      pass.partial_max = share->max;
      pass.partial_sum = share->sum;
      pass.partial_acc = share->acc;
    }
    pass.scale = p.scale;
    pass.gaussian = p.score == ScoreKind::kGaussian;
    pass.key_block = kKeyBlock;
    LaneAttention(pass, s.lanes);
    return true;
  }
  std::fill(s.acc.begin(), s.acc.begin() + rows * p.dv, 0.0f);
  std::fill(s.max.begin(), s.max.begin() + rows, kNegativeInfinity);
  std::fill(s.sum.begin(), s.sum.begin() + rows, 0.0f);

  // Over kCompiledKeys keys, a block shape of fewer rows than a full query
  // block recurs enough to repay compiling it: for float32 from 32 rows
  // (below, sgemm's call is cheaper: 8 x 262,144 keys ran 16 ms on sgemm,
  // 19 ms compiled), for bfloat16 from kFewRows + 1 (whose alternative is a
  // run-time-shaped primitive bound per block: 8 rows 15.5 -> 10.6 ms, 32
  // rows 26.3 -> 20.8 ms; float32's 32 rows 37.6 -> 34.5 ms;
  // BM_MemoryQuery).
  const int64_t min_compiled_rows = bf16 ? kFewRows + 1 : 32;
  const int64_t block = s.key_block;
  for (int64_t j0 = key_begin; j0 < scan_end; j0 += block) {
    const int64_t count = std::min(block, scan_end - j0);
    // Full blocks recur across tasks and calls, or within a call over many
    // keys (a stored memory's): they get primitives compiled for their
    // shape. (Smaller calls' blocks gained nothing measurable from them:
    // 64 x 64 x 64 runs as fast on sgemm.)
    const bool recurring =
        count == kKeyBlock &&
        (rows == kQueryBlock ||
         (rows >= min_compiled_rows && key_end >= kCompiledKeys));
    BlockProduct scores{ops.type, /*transpose_b=*/true, /*accumulate=*/false,
                        rows, count, p.d, p.d, p.d, block};
    if (!Product(ops, scores, recurring, q, ops.At(k, j0 * p.d),
                         s.scores.data())) {
      return false;
    }
    if (p.score == ScoreKind::kGaussian) {
      SubtractKeyNorms(ops, ops.At(k, j0 * p.d), count, p.d, s.scores.data(),
                       rows, block, s.norms.data());
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s.scores.data() + r * block;
      uint16_t* rounded = s.rounded.data() + r * block;
      const int64_t valid = std::clamp<int64_t>(s.limit[r] - j0, 0, count);
      if (bf16) {
        std::fill(rounded + valid, rounded + count, uint16_t{0});
      } else {
        std::fill(row + valid, row + count, 0.0f);
      }
      if (valid == 0) continue;
      const float new_max = MaxOf(row, valid, s.max[r]);
      // exp(-inf - finite) == 0: the first block rescales nothing.
      const float correction = FastExp((s.max[r] - new_max) * p.scale);
      const float block_sum =
          bf16 ? ExpShiftedSumAndRound(row, valid, new_max, p.scale, rounded)
               : ExpShiftedAndSum(row, valid, new_max, p.scale);
      s.sum[r] = s.sum[r] * correction + block_sum;
      s.max[r] = new_max;
      if (correction != 1.0f) Scale(s.acc.data() + r * p.dv, p.dv, correction);
    }
    BlockProduct pooled{ops.type, /*transpose_b=*/false, /*accumulate=*/true,
                        rows, p.dv, count, block, p.dv, p.dv};
    const void* probabilities = bf16 ? static_cast<const void*>(s.rounded.data())
                                     : static_cast<const void*>(s.scores.data());
    if (!Product(ops, pooled, recurring, probabilities,
                         ops.At(v, j0 * p.dv), s.acc.data())) {
      return false;
    }
  }
  if (share != nullptr) {
    std::copy(s.max.begin(), s.max.begin() + rows, share->max);
    std::copy(s.sum.begin(), s.sum.begin() + rows, share->sum);
    std::copy(s.acc.begin(), s.acc.begin() + rows * p.dv, share->acc);
    return true;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inverse = s.sum[r] > 0.0f ? 1.0f / s.sum[r] : 0.0f;
    const float* acc = s.acc.data() + r * p.dv;
#pragma omp simd
    for (int64_t c = 0; c < p.dv; ++c) out[r * p.dv + c] = acc[c] * inverse;
  }
  return true;
}

// One task when the weights are requested: raw scores of the query block go
// straight into the weights output (row stride lk), are normalised there, and
// the output is one product with the values (of the weights rounded to
// bfloat16 when the products are).
bool WeightsBlock(const AttentionParams& p, const Operands& ops, int64_t bh,
                  int64_t q0, int64_t rows, Scratch& s) {
  const int64_t b = bh / p.heads;
  const void* q = ops.At(ops.q, (bh * p.lq + q0) * p.d);
  const void* k = ops.At(ops.k, bh * p.lk * p.d);
  const void* v = ops.At(ops.v, bh * p.lk * p.dv);
  float* out = p.out + (bh * p.lq + q0) * p.dv;
  float* weights = p.weights + (bh * p.lq + q0) * p.lk;

  int64_t key_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    s.limit[r] = p.KeyLimit(b, q0 + r);
    key_end = std::max(key_end, s.limit[r]);
  }
  if (key_end > 0) {
    BlockProduct scores{ops.type, /*transpose_b=*/true, /*accumulate=*/false,
                        rows, key_end, p.d, p.d, p.d, p.lk};
    if (!Product(ops, scores, /*recurring=*/false, q, k, weights)) {
      return false;
    }
    if (p.score == ScoreKind::kGaussian) {
      for (int64_t j0 = 0; j0 < key_end; j0 += s.key_block) {
        const int64_t count = std::min(s.key_block, key_end - j0);
        SubtractKeyNorms(ops, ops.At(k, j0 * p.d), count, p.d, weights + j0,
                         rows, p.lk, s.norms.data());
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    SoftmaxPrefixInPlace(weights + r * p.lk, s.limit[r], p.lk, p.scale);
  }
  if (key_end == 0) {
    std::fill(out, out + rows * p.dv, 0.0f);
    return true;
  }
  const void* probabilities = weights;
  int64_t ld = p.lk;
  if (ops.type == BlockOperands::kBFloat16) {
    for (int64_t r = 0; r < rows; ++r) {
      ToBFloat16(weights + r * p.lk, key_end, s.rounded.data() + r * key_end);
    }
    probabilities = s.rounded.data();
    ld = key_end;
  }
  BlockProduct pooled{ops.type, /*transpose_b=*/false, /*accumulate=*/false,
                      rows, p.dv, key_end, ld, p.dv, p.dv};
  return Product(ops, pooled, /*recurring=*/false, probabilities, v, out);
}

// Copies of one call's operands rounded to bfloat16, stored as bfloat16
// (T = uint16_t, for bfloat16 products) or as the floats they round to
// (T = float, for float32 products that emulate them), in a buffer the
// calling thread keeps for its next call: a fresh allocation of this size
// comes from the OS as pages that fault in one by one, which cost a third of
// a large bfloat16 call. Buffers beyond 32 MiB are released at the end of
// the call.
template <typename T>
class RoundedOperands {
 public:
  RoundedOperands() = default;
  RoundedOperands(const RoundedOperands&) = delete;
  RoundedOperands& operator=(const RoundedOperands&) = delete;
  ~RoundedOperands() {
    if (Buffer().size > kKeptElements) Buffer() = Kept{};
  }

  // Rounds p's Q, K and V, in parallel; the pointers stay valid until this
  // object is destroyed. K and V held as bfloat16 are not copied (k and v
  // stay null: the caller reads p's); they go with T = uint16_t only.
  void Round(const AttentionParams& p, int threads) {
    const int64_t bh = p.batch * p.heads;
    const bool use_held = p.k_bfloat16 != nullptr;
    const size_t q_size = bh * p.lq * p.d;
    const size_t k_size = use_held ? 0 : bh * p.lk * p.d;
    const size_t total = q_size + k_size + (use_held ? 0 : bh * p.lk * p.dv);
    Kept& buffer = Buffer();
    if (buffer.size < total) {
      buffer.data.reset(new T[total]);  // uninitialised: all written
      buffer.size = total;
    }
    q = buffer.data.get();
    k = use_held ? nullptr : q + q_size;
    v = use_held ? nullptr : k + k_size;
    ParallelFor(bh, threads, [&](int64_t i) {
      RoundInto(p.q + i * p.lq * p.d, p.lq * p.d, q + i * p.lq * p.d);
      if (use_held) return;
      RoundInto(p.k + i * p.lk * p.d, p.lk * p.d, k + i * p.lk * p.d);
      RoundInto(p.v + i * p.lk * p.dv, p.lk * p.dv, v + i * p.lk * p.dv);
    });
  }

  T* q = nullptr;
  T* k = nullptr;
  T* v = nullptr;

 private:
  static constexpr size_t kKeptElements = (size_t{32} << 20) / sizeof(T);
  struct Kept {
    std::unique_ptr<T[]> data;
    size_t size = 0;
  };
  static void RoundInto(const float* from, int64_t count, uint16_t* to) {
    ToBFloat16(from, count, to);
  }
  static void RoundInto(const float* from, int64_t count, float* to) {
#pragma omp simd
    for (int64_t c = 0; c < count; ++c) to[c] = FromBFloat16(ToBFloat16(from[c]));
  }

  static Kept& Buffer() {
    thread_local Kept kept;
    return kept;
  }
};

}  // namespace

void SoftmaxPrefixInPlace(float* row, int64_t limit, int64_t columns,
                          float scale) {
  if (limit > 0) {
    const float max = MaxOf(row, limit, kNegativeInfinity);
    const float sum = ExpShiftedAndSum(row, limit, max, scale);
    Scale(row, limit, 1.0f / sum);
  }
  std::fill(row + limit, row + columns, 0.0f);
}

void CpuMaskedSoftmax(const MaskedSoftmaxParams& p, int threads) {
  ParallelFor(p.batch * p.rows, threads, [&](int64_t task) {
    const int64_t b = task / p.rows;
    const int64_t r = task % p.rows;
    float* row = p.out + task * p.columns;
    std::copy(p.x + task * p.columns, p.x + (task + 1) * p.columns, row);
    SoftmaxPrefixInPlace(row, p.valid.Limit(b, r, p.columns), p.columns, 1.0f);
  });
}

// out = the shares' outputs, each rescaled from its own max to the row's,
// over the sum of their sums rescaled alike (0 for a row with no key).
template <typename ShareOf>
void MergeKeyShares(const AttentionParams& p, int64_t tasks, int64_t shares,
                    int64_t query_blocks, const ShareOf& share_of) {
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t bh = task / query_blocks;
    const int64_t q0 = (task % query_blocks) * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, p.lq - q0);
    for (int64_t r = 0; r < rows; ++r) {
      float max = kNegativeInfinity;
      for (int64_t i = 0; i < shares; ++i) {
        max = std::max(max, share_of(task * shares + i).max[r]);
      }
      float* out = p.out + (bh * p.lq + q0 + r) * p.dv;
      std::fill(out, out + p.dv, 0.0f);
      float sum = 0.0f;
      for (int64_t i = 0; i < shares; ++i) {
        const KeyShare share = share_of(task * shares + i);
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
    }
  }
}

absl::Status CpuAttention(const AttentionParams& p, BFloat16Mode bfloat16,
                          int threads) {
  const int64_t query_blocks = (p.lq + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = p.batch * p.heads * query_blocks;
  Operands ops{BlockOperands::kFloat32, p.q, p.k, p.v};
  RoundedOperands<uint16_t> rounded;
  RoundedOperands<float> emulated;
  const bool held = p.k_bfloat16 != nullptr;
  if (bfloat16 == BFloat16Mode::kNative ||
      (bfloat16 == BFloat16Mode::kEmulated && held)) {
    rounded.Round(p, threads);
    ops = held ? Operands{BlockOperands::kBFloat16, rounded.q, p.k_bfloat16,
                          p.v_bfloat16}
               : Operands{BlockOperands::kBFloat16, rounded.q, rounded.k,
                          rounded.v};
    ops.own_products = bfloat16 != BFloat16Mode::kNative;
    static const bool amx = HasAmxProducts();
    ops.lane_bfloat16 = !ops.own_products && !amx;
  } else if (bfloat16 == BFloat16Mode::kEmulated) {
    emulated.Round(p, threads);
    ops = Operands{BlockOperands::kFloat32, emulated.q, emulated.k, emulated.v};
  }
  const bool bfloat16_products = ops.type == BlockOperands::kBFloat16;
  std::atomic<bool> failed{false};
  const int64_t query_block = std::min(kQueryBlock, p.lq);
  // Fewer tasks than threads over many keys (a stored memory's call, one
  // query or a batch of them): each task's keys are shared out among the
  // threads in whole key blocks, and the shares' partial softmaxes merged.
  const int64_t shares =
      p.weights == nullptr && tasks < threads
          ? std::min<int64_t>((threads + tasks - 1) / tasks,
                              p.lk / kMinKeysPerShare)
          : 1;
  const int64_t share_blocks =
      ((p.lk + kKeyBlock - 1) / kKeyBlock + shares - 1) / shares;
  const int64_t share_floats = query_block * (2 + p.dv);
  std::vector<float> partials(shares > 1 ? tasks * shares * share_floats : 0);
  auto share_of = [&](int64_t item) {
    KeyShare share;
    share.begin = (item % shares) * share_blocks * kKeyBlock;
    share.end = std::min(p.lk, share.begin + share_blocks * kKeyBlock);
    share.max = partials.data() + item * share_floats;
    share.sum = share.max + query_block;
    share.acc = share.sum + query_block;
    return share;
  };
  auto run = [&](int64_t item, Scratch& scratch) {
    const int64_t task = item / shares;
    const int64_t bh = task / query_blocks;
    const int64_t q0 = (task % query_blocks) * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, p.lq - q0);
    bool ok;
    if (p.weights != nullptr) {
      ok = WeightsBlock(p, ops, bh, q0, rows, scratch);
    } else if (shares > 1) {
      const KeyShare share = share_of(item);
      ok = FusedBlock(p, ops, bh, q0, rows, scratch, &share);
    } else {
      ok = FusedBlock(p, ops, bh, q0, rows, scratch);
    }
    if (!ok) failed.store(true, std::memory_order_relaxed);
  };
  const int64_t items = tasks * shares;
  auto make_scratch = [&] {
    Scratch s;
    s.key_block = std::min(kKeyBlock, p.lk);
    if (p.weights == nullptr) {
      s.scores.resize(query_block * s.key_block);
      s.acc.resize(query_block * p.dv);
      s.max.resize(query_block);
      s.sum.resize(query_block);
    }
    if (bfloat16_products) {
      s.rounded.resize(query_block * (p.weights == nullptr ? s.key_block : p.lk));
    }
    if (p.score == ScoreKind::kGaussian) s.norms.resize(s.key_block);
    s.limit.resize(query_block);
    return s;
  };
  if (threads <= 1 || items <= 1) {
    Scratch scratch = make_scratch();
    for (int64_t item = 0; item < items; ++item) run(item, scratch);
  } else {
#pragma omp parallel num_threads(threads)
    {
      Scratch scratch = make_scratch();
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < items; ++item) run(item, scratch);
    }
  }
  if (failed.load()) return absl::InternalError("oneDNN matmul failed");
  if (shares > 1) MergeKeyShares(p, tasks, shares, query_blocks, share_of);
  return absl::OkStatus();
}

absl::Status CpuAdditiveAttention(const AdditiveAttentionParams& p,
                                  int threads) {
  // Projected queries (B*Lq, h) and keys, stored transposed per batch entry
  // as (h, Lk) so that a score row is a contiguous loop over keys; each
  // feature's row padded with zeros to whole kLanes.
  constexpr int64_t kLanes = 16;
  const int64_t key_stride = (p.lk + kLanes - 1) / kLanes * kLanes;
  std::vector<float> query_features(p.batch * p.lq * p.h);
  std::vector<float> key_features(p.batch * p.lk * p.h);
  std::vector<float> key_features_t(p.batch * p.h * key_stride, 0.0f);
  if (!Gemm(true, p.batch * p.lq, p.h, p.dq, 1.0f, p.q, p.dq, p.w_q, p.dq,
            0.0f, query_features.data(), p.h) ||
      !Gemm(true, p.batch * p.lk, p.h, p.dk, 1.0f, p.k, p.dk, p.w_k, p.dk,
            0.0f, key_features.data(), p.h)) {
    return absl::InternalError("oneDNN sgemm failed");
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < p.lk; ++j) {
      for (int64_t u = 0; u < p.h; ++u) {
        key_features_t[(b * p.h + u) * key_stride + j] =
            key_features[(b * p.lk + j) * p.h + u];
      }
    }
  }
  std::atomic<bool> failed{false};
  const int64_t tasks = p.batch;
  auto run = [&](int64_t b, std::vector<float>& scores) {
    const float* kt = key_features_t.data() + b * p.h * key_stride;
    float* weights =
        p.weights != nullptr ? p.weights + b * p.lq * p.lk : scores.data();
    int64_t key_end = 0;
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t limit = p.valid.Limit(b, i, p.lk);
      key_end = std::max(key_end, limit);
      float* row = weights + i * p.lk;
      const float* qf = query_features.data() + (b * p.lq + i) * p.h;
      // kLanes keys at a time, their scores accumulated over all h
      // features before they are stored (one pass over the row, not h; and
      // a fixed-width inner loop, which GCC vectorizes across keys).
      for (int64_t j0 = 0; j0 < limit; j0 += kLanes) {
        float scores[kLanes] = {};
        for (int64_t u = 0; u < p.h; ++u) {
          const float a = qf[u];
          const float w = p.w_v[u];
          const float* kf = kt + u * key_stride + j0;
#pragma omp simd
          for (int64_t l = 0; l < kLanes; ++l) scores[l] += w * FastTanh(a + kf[l]);
        }
        std::copy(scores, scores + std::min(kLanes, limit - j0), row + j0);
      }
      SoftmaxPrefixInPlace(row, limit, p.lk, 1.0f);
    }
    float* out = p.out + b * p.lq * p.dv;
    if (key_end == 0) {
      std::fill(out, out + p.lq * p.dv, 0.0f);
    } else if (!Gemm(false, p.lq, p.dv, key_end, 1.0f, weights, p.lk,
                     p.v + b * p.lk * p.dv, p.dv, 0.0f, out, p.dv)) {
      failed.store(true, std::memory_order_relaxed);
    }
  };
  const size_t scratch_size = p.weights != nullptr ? 0 : p.lq * p.lk;
  if (threads <= 1 || tasks <= 1) {
    std::vector<float> scores(scratch_size);
    for (int64_t b = 0; b < tasks; ++b) run(b, scores);
  } else {
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> scores(scratch_size);
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < tasks; ++b) run(b, scores);
    }
  }
  if (failed.load()) return absl::InternalError("oneDNN sgemm failed");
  return absl::OkStatus();
}

const CpuKernels kKernels = {CpuMaskedSoftmax, CpuAttention,
                             CpuAdditiveAttention, CpuNadarayaWatson};

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
