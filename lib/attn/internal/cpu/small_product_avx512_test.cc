// The avx512 copy's own float32 block product and transpose
// (attn/internal/cpu/small_product_avx512.h) against plain loops in double:
// every tile height and panel width with their tails, accumulating and not,
// within float32's bound for a sum of `depth` products; the transpose
// exactly. Compiled as the avx512 copy; skipped as such on a CPU without
// AVX-512.
// (GCC 12's unmasked AVX-512 intrinsics: see softmax_avx512.h's users.)
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/cpu_isa.h"
#include "attn/internal/isa.h"
#include "gtest/gtest.h"

ATTN_ISA_BEGIN
#include "attn/internal/cpu/small_product_avx512.h"

namespace attn::internal::avx512 {
namespace {

void ProductOf(int64_t m, int64_t n, int64_t depth, const float* a,
               int64_t lda, const float* b, int64_t ldb, float* c,
               int64_t ldc, bool accumulate) {
  SmallProduct(m, n, depth, a, lda, b, ldb, c, ldc, accumulate);
}

void TransposeOf(const float* in, int64_t rows, int64_t cols, int64_t ld_in,
                 float* out, int64_t ld_out) {
  TransposeBlock(in, rows, cols, ld_in, out, ld_out);
}

}  // namespace
}  // namespace attn::internal::avx512
ATTN_ISA_END

namespace attn::internal::avx512 {
namespace {

bool HasAvx512() { return DetectCpuIsa() >= CpuIsa::kAvx512; }

std::vector<float> Uniform(int64_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> values(count);
  for (float& x : values) x = uniform(rng);
  return values;
}

TEST(SmallProductAvx512Test, EveryTileAndTailWithinFloat32sBound) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(7);
  int checked = 0;
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 64, 65}) {
    for (int64_t n : {1, 15, 16, 17, 33, 48, 64, 65, 130}) {
      for (int64_t depth : {1, 7, 64, 257}) {
        for (bool accumulate : {false, true}) {
          // Strides wider than the matrices, so that reads or writes past
          // a row's end show.
          const int64_t lda = depth + 3, ldb = n + 5, ldc = n + 2;
          const std::vector<float> a = Uniform(m * lda, rng);
          const std::vector<float> b = Uniform(depth * ldb, rng);
          std::vector<float> c = Uniform(m * ldc, rng);
          const std::vector<float> before = c;
          ProductOf(m, n, depth, a.data(), lda, b.data(), ldb, c.data(), ldc,
                    accumulate);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float got = c[i * ldc + j];
              if (j >= n) {  // past the product: untouched
                ASSERT_EQ(got, before[i * ldc + j]) << i << "," << j;
                continue;
              }
              double want = accumulate ? before[i * ldc + j] : 0.0;
              double magnitude = std::fabs(want);
              for (int64_t k = 0; k < depth; ++k) {
                const double term =
                    double{a[i * lda + k]} * double{b[k * ldb + j]};
                want += term;
                magnitude += std::fabs(term);
              }
              // A float32 sum of depth + 1 terms in any order:
              // |error| <= (depth + 1) u sum |terms| (u = 2^-24), to first
              // order; fused multiply-adds only make it smaller.
              const double bound = (depth + 2) * 0x1p-24 * magnitude;
              ASSERT_LE(std::fabs(got - want), bound)
                  << "m " << m << " n " << n << " depth " << depth
                  << " accumulate " << accumulate << " at " << i << "," << j;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 12 * 9 * 4 * 2);
}

TEST(SmallProductAvx512Test, TransposeIsExactOverTilesAndEdges) {
  if (!HasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(11);
  for (int64_t rows : {1, 15, 16, 17, 33, 64, 100}) {
    for (int64_t cols : {1, 15, 16, 17, 48, 64, 70}) {
      const int64_t ld_in = cols + 3, ld_out = rows + 1;
      const std::vector<float> in = Uniform(rows * ld_in, rng);
      std::vector<float> out(cols * ld_out, -99.0f);
      TransposeOf(in.data(), rows, cols, ld_in, out.data(), ld_out);
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < ld_out; ++i) {
          const float want = i < rows ? in[i * ld_in + j] : -99.0f;
          ASSERT_EQ(out[j * ld_out + i], want)
              << rows << "x" << cols << " at " << j << "," << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attn::internal::avx512
