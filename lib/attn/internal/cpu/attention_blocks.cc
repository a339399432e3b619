// The machinery the CPU attention implementations share
// (attn/internal/cpu/attention_blocks.h): operand copies, the bfloat16 block
// products below oneDNN's, and per-thread scratch.

// GCC 12's unmasked AVX-512 intrinsics (small_product_avx512.h): see
// fused_blocks.cc.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "attn/internal/aligned_vector.h"
#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/isa.h"
#include "attn/params.h"

ATTN_ISA_BEGIN
#include "attn/internal/vec_math.h"
#include "attn/internal/cpu/attention_blocks.h"
#include "attn/internal/cpu/small_product_avx512.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {
namespace {

// How Precision::kBFloat16 runs on this call (the kernels do not read the
// params' precision otherwise).
enum class BFloat16Mode {
  kOff,       // products on the inputs as given, in float32
  kNative,    // bfloat16 copies, bfloat16 products (AVX512-BF16 or AMX)
  kEmulated,  // copies rounded to bfloat16 kept as floats, float32 products
};

BFloat16Mode ModeOf(const CpuCall<AttentionParams>& call) {
  if (call.params.precision != Precision::kBFloat16) return BFloat16Mode::kOff;
  return call.cpu.bfloat16_products ? BFloat16Mode::kNative
                                    : BFloat16Mode::kEmulated;
}

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

}  // namespace

bool BFloat16Operands(const CpuCall<AttentionParams>& call) {
  const BFloat16Mode mode = ModeOf(call);
  return mode == BFloat16Mode::kNative ||
         (mode == BFloat16Mode::kEmulated &&
          call.params.k_bfloat16 != nullptr);
}

AttentionOperands::AttentionOperands(const CpuCall<AttentionParams>& call) {
  const AttentionParams& p = call.params;
  const BFloat16Mode mode = ModeOf(call);
  operands_ = Operands{BlockOperands::kFloat32, p.q, p.k, p.v};
  if (BFloat16Operands(call)) {
    rounded_.Round(p, call.threads);
    operands_ = p.k_bfloat16 != nullptr
                    ? Operands{BlockOperands::kBFloat16, rounded_.q,
                               p.k_bfloat16, p.v_bfloat16}
                    : Operands{BlockOperands::kBFloat16, rounded_.q,
                               rounded_.k, rounded_.v};
    operands_.own_products = mode != BFloat16Mode::kNative;
  } else if (mode == BFloat16Mode::kEmulated) {
    emulated_.Round(p, call.threads);
    operands_ = Operands{BlockOperands::kFloat32, emulated_.q, emulated_.k,
                         emulated_.v};
  }
}

float RowLogSumExp(const AttentionParams& p, const Operands& ops, int64_t row,
                   float max, double sum) {
  if (!(sum > 0.0)) return -std::numeric_limits<float>::infinity();
  double log_sum_exp = static_cast<double>(max) * p.scale + std::log(sum);
  if (p.score == ScoreKind::kGaussian) {
    double squares = 0.0;
    for (int64_t c = 0; c < p.d; ++c) {
      const double x = ops.Load(ops.q, row * p.d + c);
      squares += x * x;
    }
    log_sum_exp -= p.scale * squares / 2.0;
  }
  return static_cast<float>(log_sum_exp);
}

int64_t RowLimits(const AttentionParams& p, const Task& task, int64_t* limit) {
  const int64_t b = task.bh / p.heads;
  int64_t key_end = 0;
  for (int64_t r = 0; r < task.rows; ++r) {
    limit[r] = p.KeyLimit(b, task.q0 + r);
    key_end = std::max(key_end, limit[r]);
  }
  return key_end;
}

Scratch MakeScratch(const AttentionParams& p, bool bfloat16) {
  const int64_t query_block = std::min(kQueryBlock, p.lq);
  Scratch s;
  s.key_block = std::min(kKeyBlock, p.lk);
  if (p.weights == nullptr) {
    s.scores.resize(query_block * s.key_block);
    s.acc.resize(query_block * p.dv);
    s.max.resize(query_block);
    s.sum.resize(query_block);
  }
  if (bfloat16) {
    s.rounded.resize(query_block * (p.weights == nullptr ? s.key_block : p.lk));
  }
  if (p.score == ScoreKind::kGaussian) s.norms.resize(s.key_block);
  s.limit.resize(query_block);
  return s;
}

#if defined(ATTN_ISA_AVX512)
namespace {

// Whether the avx512 copy runs a float32 product itself: one that gets no
// compiled primitive, where dnnl_sgemm packed both operands on every call
// and ran at about half the FMA units' rate (float32 B32 L64 d64, by perf:
// 51% of the samples in its code; 0.217 -> 0.180-0.189 ms on ours). Timed
// against sgemm, one thread, d = 64:
// - below kOwnProductRows rows, transposing the keys costs more than
//   sgemm's product on them (a stored memory's 1 query x 262,144 keys:
//   10.9 ms on sgemm, 14.3 on ours; BM_MemoryQuery);
// - scores over more than kOwnProductKeys keys ran slower on ours (64 x 256:
//   17.5 us, sgemm 14.1), scores over 64 faster (3.6 us, 4.2), and the
//   second product faster or level at every size tried (64 x 256 keys:
//   11.9 us, 12.5; 128 x 512: 54.5, 56.1);
// - full blocks stay on their compiled primitives, which ran them faster
//   (float32 B8 L512: 2.27 ms, 2.55 on ours).
bool RunsOwnFloat32Product(const BlockProduct& product, bool recurring) {
  return product.operands == BlockOperands::kFloat32 && !recurring &&
         product.m >= kOwnProductRows &&
         (!product.transpose_b || product.n <= kOwnProductKeys);
}

bool OwnFloat32Product(const BlockProduct& product, const float* a,
                       const float* b, float* c) {
  int64_t ldb = product.ldb;
  if (product.transpose_b) {  // b is [n x k]: lay it out as [k x n]
    // Rows a power of two apart would share cache sets: 16 floats more.
    const int64_t ld = product.n + 16;
    thread_local std::vector<float> transposed;
    if (static_cast<int64_t>(transposed.size()) < product.k * ld) {
      transposed.resize(product.k * ld);
    }
    TransposeBlock(b, product.n, product.k, product.ldb, transposed.data(),
                   ld);
    b = transposed.data();
    ldb = ld;
  }
  SmallProduct(product.m, product.n, product.k, a, product.lda, b, ldb, c,
               product.ldc, product.accumulate);
  return true;
}

}  // namespace
#endif

bool Product(const Operands& ops, const BlockProduct& product, bool recurring,
             const void* a, const void* b, float* c) {
#if defined(ATTN_ISA_AVX512)
  if (RunsOwnFloat32Product(product, recurring)) {
    return OwnFloat32Product(product, static_cast<const float*>(a),
                             static_cast<const float*>(b), c);
  }
#endif
  if (product.operands == BlockOperands::kBFloat16 &&
      (ops.own_products || product.m <= kFewRows)) {
    return BFloat16Product(product, static_cast<const uint16_t*>(a),
                           static_cast<const uint16_t*>(b), c);
  }
  return RunBlockProduct(product, recurring, a, b, c);
}

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

}  // namespace attn::internal::ATTN_ISA_NAMESPACE
ATTN_ISA_END
