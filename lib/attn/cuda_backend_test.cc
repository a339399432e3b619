// The CUDA backend against the reference (double accumulation), with the
// tolerance FlashAttention's tests use: an output may be at most twice as far
// from the reference as a naive computation in the same precision is (the
// naive loops are below), plus 2^-20 of the largest |reference| so that rows
// where the naive computation happens to be exact (a valid length of 1) do
// not demand exactness from 3xTF32, whose split keeps ~21 of 24 bits.
//
// Without a usable GPU (always in CI) every test that needs one is skipped
// with the reason, and CTest reports it as skipped, not passed; the tests of
// how the library behaves without a GPU run instead.
#include "attn/cuda_backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attn/bfloat16.h"
#include "attn/engine.h"
#include "attn/held_memory.h"
#include "attn/reference.h"
#include "attn/testing/compare.h"
#include "attn/testing/engines.h"
#include "attn/testing/random.h"
#include "gtest/gtest.h"

namespace attn {
namespace {

using ::attn::testing::AllClose;
using ::attn::testing::AllExactly;
using ::attn::testing::RandomLengths;
using ::attn::testing::RandomNormal;
using ::attn::testing::ReferenceEngine;
using ::attn::testing::ViewOf;

// ---- the GPU, once per process ---------------------------------------------

struct Gpu {
  std::unique_ptr<Engine> fused;    // cuda (fused attention on), reference
  std::unique_ptr<Engine> unfused;  // cuda (fused attention off), reference
  std::unique_ptr<Engine> no_decode;  // cuda (decode kernel off), reference
  CudaBackend* backend = nullptr;   // fused's CUDA backend
  std::string unavailable;          // why there is none, when there is none
};

Gpu& TheGpu() {
  static Gpu* gpu = [] {
    auto* gpu = new Gpu;
    auto make = [gpu](bool fused, bool decode = true) -> std::unique_ptr<Engine> {
      CudaBackend::Options options;
      options.fused_attention = fused;
      options.decode_attention = decode;
      auto backend = CudaBackend::Create(options);
      if (!backend.ok()) {
        gpu->unavailable = std::string(backend.status().message());
        return nullptr;
      }
      CudaBackend* raw = backend->get();
      std::vector<std::unique_ptr<Backend>> list;
      list.push_back(std::move(backend).value());
      auto engine = Engine::CreateWithBackends(std::move(list));
      if (!engine.ok()) return nullptr;
      if (fused && decode) gpu->backend = raw;
      return std::move(engine).value();
    };
    gpu->fused = make(true);
    if (gpu->fused != nullptr) {
      gpu->unfused = make(false);
      gpu->no_decode = make(true, false);
    }
    return gpu;
  }();
  return *gpu;
}

#define REQUIRE_GPU()                                                \
  do {                                                               \
    if (TheGpu().fused == nullptr) {                                 \
      GTEST_SKIP() << "no usable GPU: " << TheGpu().unavailable;     \
    }                                                                \
  } while (0)

// ---- naive same-precision computations -------------------------------------

// The naive computation's and the tested result's distance from the
// reference, and the tolerance derived from them.
::testing::AssertionResult WithinTwiceNaive(const Tensor& actual,
                                            const Tensor& naive,
                                            const Tensor& reference) {
  if (actual.shape != reference.shape || naive.shape != reference.shape) {
    return ::testing::AssertionFailure() << "shape mismatch";
  }
  double naive_error = 0.0, largest = 0.0, error = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < reference.data.size(); ++i) {
    const double expected = reference.data[i];
    naive_error = std::max(naive_error, std::fabs(naive.data[i] - expected));
    largest = std::max(largest, std::fabs(expected));
    const double e = std::fabs(static_cast<double>(actual.data[i]) - expected);
    if (!(e <= error)) {  // NaN counts as the worst
      error = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      worst = i;
    }
  }
  const double tolerance = 2.0 * naive_error + std::ldexp(largest, -20);
  if (error <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max error " << error << " at " << worst << " (got "
         << actual.data[worst] << ", want " << reference.data[worst]
         << ") exceeds 2 x naive error " << naive_error << " + 2^-20 x "
         << largest << " = " << tolerance;
}

// Rows of scores -> probabilities in float, keys at or past `limit` zero.
void NaiveSoftmax(float* row, int64_t columns, int64_t limit) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < limit; ++j) max_value = std::max(max_value, row[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < limit; ++j) sum += std::exp(row[j] - max_value);
  for (int64_t j = 0; j < columns; ++j) {
    row[j] = j < limit ? std::exp(row[j] - max_value) / sum : 0.0f;
  }
}

// PyTorch's attention at one precision: products' operands and results
// rounded to it, float32 inside the softmax.
Tensor NaiveAttention(const AttentionRequest& r, int64_t heads,
                      std::vector<float>* weights) {
  const Shape& qs = r.queries.shape;
  const int64_t batch = qs[0], lq = qs[qs.size() - 2], d = qs.back();
  const int64_t lk = r.keys.shape[r.keys.shape.size() - 2];
  const int64_t dv = r.values.shape.back();
  const float scale = r.scale.value_or(
      r.score == ScoreKind::kDotProduct ? 1.0f / std::sqrt(float(d)) : 1.0f);
  Shape out_shape = qs;
  out_shape.back() = dv;
  Tensor out = Tensor::Zeros(out_shape);
  const Precision p = r.precision;
  weights->assign(batch * heads * lq * lk, 0.0f);
  std::vector<float> row(lk);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t bh = b * heads + h;
      for (int64_t i = 0; i < lq; ++i) {
        int64_t limit = lk;
        if (r.valid_lens.data != nullptr) {
          limit = r.valid_lens.shape.size() == 1
                      ? r.valid_lens.data[b]
                      : r.valid_lens.data[b * lq + i];
        }
        if (r.causal) limit = std::min(limit, i + 1);
        const float* q = r.queries.data + (bh * lq + i) * d;
        for (int64_t j = 0; j < lk; ++j) {
          const float* k = r.keys.data + (bh * lk + j) * d;
          float acc = 0.0f;
          for (int64_t c = 0; c < d; ++c) {
            if (r.score == ScoreKind::kDotProduct) {
              acc += RoundOperand(q[c], p) * RoundOperand(k[c], p);
            } else {
              const float diff = q[c] - k[c];
              acc += diff * diff;
            }
          }
          row[j] = r.score == ScoreKind::kDotProduct
                       ? RoundOperand(acc * scale, p)
                       : -0.5f * scale * acc;
        }
        NaiveSoftmax(row.data(), lk, limit);
        float* w = weights->data() + (bh * lq + i) * lk;
        for (int64_t j = 0; j < lk; ++j) w[j] = row[j];
        for (int64_t c = 0; c < dv; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j < lk; ++j) {
            acc += RoundOperand(row[j], p) *
                   RoundOperand(r.values.data[(bh * lk + j) * dv + c], p);
          }
          out.data[(bh * lq + i) * dv + c] = RoundOperand(acc, p);
        }
      }
    }
  }
  return out;
}

// ---- tests that run everywhere ---------------------------------------------

TEST(CudaBackendWithoutGpuTest, CreateSaysWhyOrWorks) {
  auto backend = CudaBackend::Create(CudaBackend::Options{});
  if (backend.ok()) {
    EXPECT_TRUE(CudaBackend::Compiled());
    EXPECT_NE((*backend)->description().find("compute"), std::string::npos);
    return;
  }
  // No GPU: a clear reason, and the code the engine relies on.
  EXPECT_FALSE(backend.status().message().empty());
  if (CudaBackend::Compiled()) {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
        << backend.status();
  } else {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnimplemented)
        << backend.status();
  }
}

TEST(CudaBackendWithoutGpuTest, DeviceChoiceOfTheEngine) {
  const bool have_gpu = CudaBackend::Create(CudaBackend::Options{}).ok();
  EngineOptions cuda;
  cuda.device = Device::kCuda;
  auto forced = Engine::Create(cuda);
  EngineOptions automatic;
  automatic.device = Device::kAuto;
  auto fallback = Engine::Create(automatic);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  if (have_gpu) {
    ASSERT_TRUE(forced.ok()) << forced.status();
    EXPECT_EQ((*forced)->backend_names().front(), "cuda");
    EXPECT_EQ((*fallback)->backend_names().front(), "cuda");
    EXPECT_TRUE((*fallback)->notes().empty());
  } else {
    // --backend=cuda must fail at start, with the reason; auto falls back
    // to the CPU and says why.
    EXPECT_EQ(forced.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(forced.status().message().find("cuda"), std::string::npos)
        << forced.status();
    EXPECT_NE((*fallback)->backend_names().front(), "cuda");
    ASSERT_EQ((*fallback)->notes().size(), 1u);
    EXPECT_NE((*fallback)->notes()[0].find("CPU"), std::string::npos);
  }
}

TEST(CudaRoutingTest, SmallCallsStayOnTheCpu) {
  REQUIRE_GPU();
  // The server's --cuda_min_flops: a toy call runs on the CPU, a call past
  // the threshold on the GPU (attn/minimum_work_backend_test.cc proves the
  // rule itself without a GPU).
  EngineOptions options;
  options.device = Device::kCuda;
  options.cuda_min_work = MinimumWork::All(1e6);
  auto engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_NE((*engine)->backend_descriptions().front().find("1e+06 flops"),
            std::string::npos);
  std::mt19937 rng(17);
  auto run = [&](int64_t length) {
    const Tensor q = RandomNormal(rng, {1, length, 64});
    const Tensor k = RandomNormal(rng, {1, length, 64});
    const Tensor v = RandomNormal(rng, {1, length, 64});
    AttentionRequest request;
    request.queries = q.view();
    request.keys = k.view();
    request.values = v.view();
    auto result = (*engine)->ScaledDotProductAttention(request);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->backend : std::string();
  };
  EXPECT_EQ(run(4), "onednn-cpu");  // 8 Kflop
  EXPECT_EQ(run(128), "cuda");      // 4.2 Mflop
}

TEST(CudaRoutingTest, LogSumExpCallsRunOnTheCpu) {
  REQUIRE_GPU();
  // The GPU kernels keep no per-row log-sum-exp to give (attn/pieces.h):
  // such a call runs on the CPU, the same call without it on the GPU.
  EngineOptions options;
  options.device = Device::kCuda;
  auto engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 rng(18);
  const Tensor q = RandomNormal(rng, {1, 128, 64});
  const Tensor k = RandomNormal(rng, {1, 128, 64});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = request.values = k.view();
  request.return_log_sum_exp = true;
  auto with = (*engine)->ScaledDotProductAttention(request);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->backend, "onednn-cpu");
  EXPECT_EQ(with->log_sum_exp.shape, (Shape{1, 128}));
  request.return_log_sum_exp = false;
  auto without = (*engine)->ScaledDotProductAttention(request);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->backend, "cuda");
}

// ---- attention ------------------------------------------------------------

enum class Mask { kNone, kPerBatch, kPerRow, kCausal, kCausalPerRow };

struct AttentionCase {
  int64_t batch, heads, lq, lk, d, dv;
  Mask mask;
  Precision precision;
  ScoreKind score = ScoreKind::kDotProduct;
};

std::string Describe(const AttentionCase& c) {
  static const char* const kMasks[] = {"none", "batch", "row", "causal",
                                       "causalrow"};
  return absl::StrCat("b", c.batch, "h", c.heads, "q", c.lq, "k", c.lk, "d",
                      c.d, "v", c.dv, "_", kMasks[static_cast<int>(c.mask)],
                      "_", PrecisionName(c.precision),
                      c.score == ScoreKind::kGaussian ? "_gauss" : "");
}
std::string CaseName(const ::testing::TestParamInfo<AttentionCase>& info) {
  return Describe(info.param);
}
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << Describe(c); }

class CudaAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaAttentionTest, FusedAndUnfusedWithinTwiceNaiveError) {
  REQUIRE_GPU();
  const AttentionCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.lq * 131 + c.lk * 7 + c.d));
  auto shape = [&](int64_t length, int64_t depth) {
    return c.heads > 1 ? Shape{c.batch, c.heads, length, depth}
                       : Shape{c.batch, length, depth};
  };
  const Tensor q = RandomNormal(rng, shape(c.lq, c.d));
  const Tensor k = RandomNormal(rng, shape(c.lk, c.d));
  const Tensor v = RandomNormal(rng, shape(c.lk, c.dv));
  std::vector<int32_t> lengths;
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.precision = c.precision;
  request.score = c.score;
  request.causal = c.mask == Mask::kCausal || c.mask == Mask::kCausalPerRow;
  if (c.mask == Mask::kPerBatch) {
    lengths = RandomLengths(rng, c.batch, 0, static_cast<int32_t>(c.lk));
    lengths[0] = 0;  // a row with nothing to attend: zeros
    request.valid_lens = ViewOf(lengths, {c.batch});
  } else if (c.mask == Mask::kPerRow || c.mask == Mask::kCausalPerRow) {
    lengths = RandomLengths(rng, c.batch * c.lq, 0, static_cast<int32_t>(c.lk));
    lengths[0] = 0;
    if (lengths.size() > 1) lengths[1] = 1;
    request.valid_lens = ViewOf(lengths, {c.batch, c.lq});
  }
  std::vector<float> naive_weights;
  const Tensor naive = NaiveAttention(request, c.heads, &naive_weights);
  request.return_weights = true;
  auto reference = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(reference.ok()) << reference.status();

  for (Engine* engine : {TheGpu().fused.get(), TheGpu().unfused.get()}) {
    for (bool weights : {false, true}) {
      SCOPED_TRACE(absl::StrCat(engine == TheGpu().fused.get() ? "fused" : "unfused",
                                weights ? ", weights" : ""));
      request.return_weights = weights;
      auto result = engine->ScaledDotProductAttention(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->backend, "cuda");
      // The fused kernel's head dims: 32, 64 and 128 (cuda/kernels.h).
      const bool fused = engine == TheGpu().fused.get() && !weights &&
                         c.score == ScoreKind::kDotProduct && c.d == c.dv &&
                         (c.d == 32 || c.d == 64 || c.d == 128);
      EXPECT_EQ(result->implementation,
                fused ? "cuda-fused-attention" : "cuda-unfused-attention");
      EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output));
      if (!weights) continue;
      Tensor naive_w = Tensor::Zeros(reference->weights.shape);
      naive_w.data.assign(naive_weights.begin(), naive_weights.end());
      EXPECT_TRUE(WithinTwiceNaive(result->weights, naive_w, reference->weights));
      // Masked keys get exactly zero weight.
      for (size_t i = 0; i < naive_weights.size(); ++i) {
        if (reference->weights.data[i] == 0.0f && naive_weights[i] == 0.0f) {
          ASSERT_EQ(result->weights.data[i], 0.0f) << "weight " << i;
        }
      }
    }
  }
}

std::vector<AttentionCase> AttentionCases() {
  std::vector<AttentionCase> cases;
  for (Precision p : {Precision::kFloat32, Precision::kBFloat16,
                      Precision::kFloat16}) {
    for (Mask m : {Mask::kNone, Mask::kPerBatch, Mask::kPerRow, Mask::kCausal,
                   Mask::kCausalPerRow}) {
      cases.push_back({2, 1, 97, 257, 64, 64, m, p});
      cases.push_back({1, 3, 130, 67, 128, 128, m, p});
      cases.push_back({3, 2, 1, 129, 32, 32, m, p});
    }
    cases.push_back({2, 2, 64, 64, 64, 64, Mask::kNone, p});
    cases.push_back({1, 1, 257, 1, 32, 32, Mask::kNone, p});
    cases.push_back({2, 1, 33, 65, 48, 48, Mask::kPerRow, p});  // unfused d
    cases.push_back({2, 1, 33, 65, 64, 24, Mask::kCausal, p});  // dv != d
  }
  cases.push_back({2, 1, 40, 70, 16, 8, Mask::kPerRow, Precision::kFloat32,
                   ScoreKind::kGaussian});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaAttentionTest,
                         ::testing::ValuesIn(AttentionCases()), CaseName);

// ---- few rows over many keys: the keys split across the GPU -----------------

struct SplitCase {
  int64_t lq, lk, d;
  Mask mask;
  Precision precision;
};

std::string DescribeSplit(const SplitCase& c) {
  static const char* const kMasks[] = {"none", "batch", "row", "causal",
                                       "causalrow"};
  return absl::StrCat("q", c.lq, "k", c.lk, "d", c.d, "_",
                      kMasks[static_cast<int>(c.mask)], "_",
                      PrecisionName(c.precision));
}
void PrintTo(const SplitCase& c, std::ostream* os) { *os << DescribeSplit(c); }

class CudaSplitKeysTest : public ::testing::TestWithParam<SplitCase> {};

// A stored memory's shape (one batch entry, few query rows, many keys): the
// decode kernel (at most 4 unmasked rows), the split fused kernel, their
// exact merge, and the CPU's key shares, which merge their shares the same
// way, each within twice the naive error of the reference.
TEST_P(CudaSplitKeysTest, SplitsMergeWithinTwiceNaiveErrorAsTheCpuKeySharesDo) {
  REQUIRE_GPU();
  const SplitCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.lq * 131 + c.lk * 7 + c.d));
  const Tensor q = RandomNormal(rng, {1, c.lq, c.d});
  const Tensor k = RandomNormal(rng, {1, c.lk, c.d});
  const Tensor v = RandomNormal(rng, {1, c.lk, c.d});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.precision = c.precision;
  std::vector<int32_t> lengths;
  if (c.mask == Mask::kPerRow) {
    // Lengths that end inside a split, at a split's edge, and at 0.
    lengths = RandomLengths(rng, c.lq, 0, static_cast<int32_t>(c.lk));
    lengths[0] = 0;
    if (c.lq > 1) lengths[1] = 1;
    if (c.lq > 2) lengths[2] = static_cast<int32_t>(c.lk);
    request.valid_lens = ViewOf(lengths, {1, c.lq});
  }
  std::vector<float> naive_weights;
  const Tensor naive = NaiveAttention(request, 1, &naive_weights);
  auto reference = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(reference.ok()) << reference.status();

  auto gpu = TheGpu().fused->ScaledDotProductAttention(request);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const bool decodes = c.lq <= 4 && c.mask == Mask::kNone;
  EXPECT_EQ(gpu->implementation, decodes ? "cuda-decode" : "cuda-split-keys");
  EXPECT_TRUE(WithinTwiceNaive(gpu->output, naive, reference->output));
  if (decodes) {  // the split fused kernel on the same call
    auto split = TheGpu().no_decode->ScaledDotProductAttention(request);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(split->implementation, "cuda-split-keys");
    EXPECT_TRUE(WithinTwiceNaive(split->output, naive, reference->output));
  }
  for (int64_t i = 0; i < c.lq && !lengths.empty(); ++i) {
    if (lengths[i] != 0) continue;
    for (int64_t j = 0; j < c.d; ++j) {
      ASSERT_EQ(gpu->output.data[i * c.d + j], 0.0f) << "row " << i;
    }
  }
  auto cpu = ::attn::testing::OptimizedEngine(::attn::testing::Threads::kAlwaysParallel)
                 .ScaledDotProductAttention(request);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(WithinTwiceNaive(cpu->output, naive, reference->output));
}

std::vector<SplitCase> SplitCases() {
  std::vector<SplitCase> cases;
  for (Precision p : {Precision::kFloat32, Precision::kBFloat16}) {
    for (int64_t d : {32, 64, 128}) cases.push_back({1, 20011, d, Mask::kNone, p});
    cases.push_back({3, 100003, 64, Mask::kNone, p});   // decode, 4-row
    cases.push_back({4, 3000, 128, Mask::kNone, p});    // decode, few splits
    cases.push_back({5, 65536 + 37, 64, Mask::kNone, p});
    cases.push_back({16, 8192, 64, Mask::kPerRow, p});
    cases.push_back({17, 4096 + 1, 64, Mask::kNone, p});  // 64-row blocks
    cases.push_back({64, 30000, 64, Mask::kPerRow, p});
  }
  cases.push_back({2, 9000, 64, Mask::kNone, Precision::kFloat16});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Memory, CudaSplitKeysTest, ::testing::ValuesIn(SplitCases()),
    [](const ::testing::TestParamInfo<SplitCase>& info) {
      return DescribeSplit(info.param);
    });

// ---- held memories ------------------------------------------------------------

// An engine of its own (the CUDA backend, then the CPU) with a held-memory
// budget, and the events its backend reported.
struct HeldEngine {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<std::vector<std::string>> events =
      std::make_shared<std::vector<std::string>>();
};

HeldEngine MakeHeldEngine(int64_t budget) {
  HeldEngine held;
  EngineOptions options;
  options.device = Device::kCuda;
  options.cuda_held_memory_bytes = budget;
  options.cuda_min_work = MinimumWork::All(1e9);  // held calls take none
  auto events = held.events;
  options.on_held_memory_event = [events](const HeldMemoryEvent& event) {
    events->push_back(absl::StrCat(HeldMemoryEventName(event.kind), " ",
                                   event.label));
  };
  auto engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) held.engine = std::move(engine).value();
  return held;
}

// A memory of n keys and values (d = v = 64) and one call's queries.
struct Memory {
  Tensor keys, values, queries;
  std::vector<uint16_t> key_bits, value_bits;
  Memory(std::mt19937& rng, int64_t n, int64_t rows, bool bfloat16) {
    keys = RandomNormal(rng, {1, n, 64});
    values = RandomNormal(rng, {1, n, 64});
    queries = RandomNormal(rng, {1, rows, 64});
    if (bfloat16) {
      for (float& x : keys.data) x = RoundToBFloat16(x);
      for (float& x : values.data) x = RoundToBFloat16(x);
      for (float x : keys.data) key_bits.push_back(BFloat16Bits(x));
      for (float x : values.data) value_bits.push_back(BFloat16Bits(x));
    }
  }
  int64_t bytes() const {
    return static_cast<int64_t>(
        key_bits.empty() ? 4 * (keys.data.size() + values.data.size())
                         : 2 * (key_bits.size() + value_bits.size()));
  }
  // The request a server makes of it; `as_floats` gives the same values as
  // float32 tensors (for the reference).
  AttentionRequest Request(const HeldMemory* held, bool as_floats = false) const {
    AttentionRequest request;
    request.queries = queries.view();
    request.keys = keys.view();
    request.values = values.view();
    if (!key_bits.empty()) {
      request.precision = Precision::kBFloat16;
      if (!as_floats) {
        request.keys.data = request.values.data = nullptr;
        request.keys_bfloat16 = key_bits.data();
        request.values_bfloat16 = value_bits.data();
      }
    }
    request.held = as_floats ? nullptr : held;
    return request;
  }
};

TEST(CudaHeldMemoryTest, PlacedOnceAndExactOverEveryPath) {
  REQUIRE_GPU();
  HeldEngine gpu = MakeHeldEngine(0);
  ASSERT_NE(gpu.engine, nullptr);
  std::mt19937 rng(44);
  for (const auto& [bfloat16, rows] :
       std::vector<std::pair<bool, int64_t>>{{false, 1}, {false, 7}, {true, 1}, {true, 7}}) {
    SCOPED_TRACE(absl::StrCat(bfloat16 ? "bfloat16" : "float32", ", rows ", rows));
    const Memory memory(rng, 40000, rows, bfloat16);
    const auto held = std::make_unique<HeldMemory>("m");
    const HeldMemoryStats before = *gpu.engine->held_memory_stats();
    AttentionRequest plain = memory.Request(nullptr, /*as_floats=*/true);
    std::vector<float> naive_weights;
    const Tensor naive = NaiveAttention(plain, 1, &naive_weights);
    plain.return_weights = true;
    auto reference = ReferenceEngine().ScaledDotProductAttention(plain);
    ASSERT_TRUE(reference.ok());
    Tensor naive_w = Tensor::Zeros(reference->weights.shape);
    naive_w.data.assign(naive_weights.begin(), naive_weights.end());
    for (int call = 0; call < 3; ++call) {
      for (bool weights : {false, true}) {
        AttentionRequest request = memory.Request(held.get());
        request.return_weights = weights;
        auto result = gpu.engine->ScaledDotProductAttention(request);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->backend, "cuda");
        EXPECT_EQ(result->implementation,
                  weights    ? "cuda-unfused-attention"
                  : rows <= 4 ? "cuda-decode"
                             : "cuda-split-keys");
        EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output));
        if (weights) {
          EXPECT_TRUE(WithinTwiceNaive(result->weights, naive_w,
                                       reference->weights));
        }
      }
    }
    const HeldMemoryStats after = *gpu.engine->held_memory_stats();
    EXPECT_EQ(after.placements, before.placements + 1) << "copied more than once";
    EXPECT_EQ(after.bytes_held, before.bytes_held + memory.bytes());
  }
}

TEST(CudaHeldMemoryTest, GaussianScoresReadTheHeldCopy) {
  REQUIRE_GPU();
  HeldEngine gpu = MakeHeldEngine(0);
  ASSERT_NE(gpu.engine, nullptr);
  std::mt19937 rng(45);
  const Memory memory(rng, 5000, 3, false);
  const auto held = std::make_unique<HeldMemory>("g");
  AttentionRequest request = memory.Request(held.get());
  request.score = ScoreKind::kGaussian;
  AttentionRequest plain = memory.Request(nullptr, true);
  plain.score = ScoreKind::kGaussian;
  std::vector<float> naive_weights;
  const Tensor naive = NaiveAttention(plain, 1, &naive_weights);
  auto reference = ReferenceEngine().ScaledDotProductAttention(plain);
  ASSERT_TRUE(reference.ok());
  for (int call = 0; call < 2; ++call) {
    auto result = gpu.engine->ScaledDotProductAttention(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->backend, "cuda");
    EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output));
  }
  EXPECT_EQ(gpu.engine->held_memory_stats()->placements, 1);
}

TEST(CudaHeldMemoryTest, FreedWhenTheMemoryIsGoneAndItsLastCallEnds) {
  REQUIRE_GPU();
  HeldEngine gpu = MakeHeldEngine(0);
  ASSERT_NE(gpu.engine, nullptr);
  std::mt19937 rng(46);
  const Memory memory(rng, 30000, 4, false);
  auto held = std::make_unique<HeldMemory>("replaced");
  // Calls from several threads while the memory is replaced under them:
  // every call answers, and the copy goes once the last has ended.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, request = memory.Request(held.get())] {
      for (int i = 0; i < 5; ++i) {
        if (!gpu.engine->ScaledDotProductAttention(request).ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(gpu.engine->held_memory_stats()->bytes_held, memory.bytes());
  held.reset();
  const HeldMemoryStats after = *gpu.engine->held_memory_stats();
  EXPECT_EQ(after.bytes_held, 0);
  EXPECT_EQ(after.memories_held, 0);
  ASSERT_FALSE(gpu.events->empty());
  EXPECT_EQ(gpu.events->back(), "freed replaced");
}

TEST(CudaHeldMemoryTest, LeastRecentlyUsedOutAndTooLargeRunsOnTheCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(47);
  const Memory a(rng, 4096, 2, false), b(rng, 4096, 2, false),
      big(rng, 16384, 2, false);
  // Room for a or b (2 MiB each), not both; never for big (8 MiB).
  HeldEngine gpu = MakeHeldEngine(3 << 20);
  ASSERT_NE(gpu.engine, nullptr);
  const auto held_a = std::make_unique<HeldMemory>("a");
  const auto held_b = std::make_unique<HeldMemory>("b");
  const auto held_big = std::make_unique<HeldMemory>("big");
  auto run = [&](const Memory& memory, const HeldMemory* held) {
    auto result = gpu.engine->ScaledDotProductAttention(memory.Request(held));
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return std::string();
    auto reference = ReferenceEngine().ScaledDotProductAttention(
        memory.Request(nullptr, true));
    EXPECT_TRUE(AllClose(result->output, reference->output, 1e-5, 1e-4));
    return result->backend;
  };
  EXPECT_EQ(run(a, held_a.get()), "cuda");
  EXPECT_EQ(run(b, held_b.get()), "cuda");  // evicts a
  EXPECT_EQ(run(big, held_big.get()), "onednn-cpu");
  EXPECT_EQ(run(big, held_big.get()), "onednn-cpu");
  const HeldMemoryStats stats = *gpu.engine->held_memory_stats();
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_EQ(stats.refusals, 2);
  EXPECT_EQ(stats.memories_held, 1);
  EXPECT_EQ(*gpu.events, (std::vector<std::string>{"placed a", "evicted a",
                                                   "placed b", "refused big"}));
}

// ---- the other operations ---------------------------------------------------

TEST(CudaOpsTest, MaskedSoftmaxWithinTwiceNaiveError) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  for (const Shape& shape : {Shape{1, 1, 1}, Shape{3, 7, 1000}, Shape{2, 97, 33}}) {
    const Tensor x = RandomNormal(rng, shape, 4.0f);
    std::vector<int32_t> lengths =
        RandomLengths(rng, shape[0] * shape[1], 0, static_cast<int32_t>(shape[2]));
    lengths[0] = 0;
    MaskedSoftmaxRequest request{x.view(), ViewOf(lengths, {shape[0], shape[1]})};
    auto reference = ReferenceEngine().MaskedSoftmax(request);
    ASSERT_TRUE(reference.ok());
    Tensor naive = x;
    for (int64_t r = 0; r < shape[0] * shape[1]; ++r) {
      NaiveSoftmax(naive.data.data() + r * shape[2], shape[2], lengths[r]);
    }
    auto result = TheGpu().fused->MaskedSoftmax(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->backend, "cuda");
    EXPECT_EQ(result->implementation, "cuda-masked-softmax");
    EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output));
    for (int64_t r = 0; r < shape[0] * shape[1]; ++r) {
      EXPECT_TRUE(AllExactly(result->output, 0.0f, r * shape[2] + lengths[r],
                             (r + 1) * shape[2]));
    }
  }
}

TEST(CudaOpsTest, BatchMatmulWithinTwiceNaiveError) {
  REQUIRE_GPU();
  std::mt19937 rng(12);
  for (Precision p : {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    for (const auto& [n, m, k, pp] : std::vector<std::array<int64_t, 4>>{
             {1, 1, 1, 1}, {3, 97, 257, 5}, {2, 64, 64, 64}, {7, 1, 300, 9}}) {
      const Tensor a = RandomNormal(rng, {n, m, k});
      const Tensor b = RandomNormal(rng, {n, k, pp});
      BatchMatmulRequest request{a.view(), b.view(), p};
      auto reference = ReferenceEngine().BatchMatmul(request);
      ASSERT_TRUE(reference.ok());
      Tensor naive = Tensor::Zeros({n, m, pp});
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t c = 0; c < pp; ++c) {
            float acc = 0.0f;
            for (int64_t t = 0; t < k; ++t) {
              acc += RoundOperand(a.data[(i * m + r) * k + t], p) *
                     RoundOperand(b.data[(i * k + t) * pp + c], p);
            }
            naive.data[(i * m + r) * pp + c] = RoundOperand(acc, p);
          }
        }
      }
      auto result = TheGpu().fused->BatchMatmul(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->backend, "cuda");
      EXPECT_EQ(result->implementation, "cublas-matmul");
      EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output))
          << PrecisionName(p) << " " << n << "x" << m << "x" << k << "x" << pp;
    }
  }
}

TEST(CudaOpsTest, AdditiveAttentionWithinTwiceNaiveError) {
  REQUIRE_GPU();
  std::mt19937 rng(13);
  const int64_t batch = 3, lq = 17, lk = 41, dq = 20, dk = 12, h = 9, dv = 5;
  const Tensor q = RandomNormal(rng, {batch, lq, dq});
  const Tensor k = RandomNormal(rng, {batch, lk, dk});
  const Tensor v = RandomNormal(rng, {batch, lk, dv});
  const Tensor w_q = RandomNormal(rng, {h, dq}, 0.3f);
  const Tensor w_k = RandomNormal(rng, {h, dk}, 0.3f);
  const Tensor w_v = RandomNormal(rng, {h});
  std::vector<int32_t> lengths = RandomLengths(rng, batch * lq, 0, lk);
  lengths[0] = 0;
  AdditiveAttentionRequest request{q.view(), k.view(), v.view(), w_q.view(),
                                   w_k.view(), w_v.view(),
                                   ViewOf(lengths, {batch, lq}), true};
  auto reference = ReferenceEngine().AdditiveAttention(request);
  ASSERT_TRUE(reference.ok());
  Tensor naive = Tensor::Zeros({batch, lq, dv});
  Tensor naive_w = Tensor::Zeros({batch, lq, lk});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < lq; ++i) {
      float* row = naive_w.data.data() + (b * lq + i) * lk;
      for (int64_t j = 0; j < lk; ++j) {
        float score = 0.0f;
        for (int64_t u = 0; u < h; ++u) {
          float qp = 0.0f, kp = 0.0f;
          for (int64_t c = 0; c < dq; ++c) qp += w_q.data[u * dq + c] * q.data[(b * lq + i) * dq + c];
          for (int64_t c = 0; c < dk; ++c) kp += w_k.data[u * dk + c] * k.data[(b * lk + j) * dk + c];
          score += w_v.data[u] * std::tanh(qp + kp);
        }
        row[j] = score;
      }
      NaiveSoftmax(row, lk, lengths[b * lq + i]);
      for (int64_t c = 0; c < dv; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < lk; ++j) acc += row[j] * v.data[(b * lk + j) * dv + c];
        naive.data[(b * lq + i) * dv + c] = acc;
      }
    }
  }
  auto result = TheGpu().fused->AdditiveAttention(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->backend, "cuda");
  EXPECT_EQ(result->implementation, "cuda-additive");
  EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output));
  EXPECT_TRUE(WithinTwiceNaive(result->weights, naive_w, reference->weights));
}

TEST(CudaOpsTest, NadarayaWatsonEveryKernelWithinTwiceNaiveError) {
  REQUIRE_GPU();
  std::mt19937 rng(14);
  const int64_t n = 300, m = 77, dx = 3, dy = 2;
  const Tensor x_train = RandomNormal(rng, {n, dx});
  const Tensor y_train = RandomNormal(rng, {n, dy});
  const Tensor x_query = RandomNormal(rng, {m, dx}, 1.5f);
  for (RegressionKernel kernel :
       {RegressionKernel::kGaussian, RegressionKernel::kBoxcar,
        RegressionKernel::kConstant, RegressionKernel::kEpanechnikov}) {
    SCOPED_TRACE(RegressionKernelName(kernel));
    NadarayaWatsonRequest request{x_train.view(), y_train.view(),
                                  x_query.view(), kernel, 1.7f, true};
    auto reference = ReferenceEngine().NadarayaWatson(request);
    ASSERT_TRUE(reference.ok());
    Tensor naive = Tensor::Zeros({m, dy});
    Tensor naive_w = Tensor::Zeros({m, n});
    for (int64_t i = 0; i < m; ++i) {
      float* row = naive_w.data.data() + i * n;
      for (int64_t j = 0; j < n; ++j) {
        float squared = 0.0f;
        for (int64_t c = 0; c < dx; ++c) {
          const float diff = x_query.data[i * dx + c] - x_train.data[j * dx + c];
          squared += diff * diff;
        }
        const float u = 1.7f * std::sqrt(squared);
        row[j] = kernel == RegressionKernel::kGaussian
                     ? -0.5f * u * u
                     : static_cast<float>(RegressionKernelValue(kernel, u));
      }
      if (kernel == RegressionKernel::kGaussian) {
        NaiveSoftmax(row, n, n);
      } else {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) sum += row[j];
        for (int64_t j = 0; j < n; ++j) row[j] = sum > 0.0f ? row[j] / sum : 0.0f;
      }
      for (int64_t c = 0; c < dy; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; ++j) acc += row[j] * y_train.data[j * dy + c];
        naive.data[i * dy + c] = acc;
      }
    }
    auto result = TheGpu().fused->NadarayaWatson(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->backend, "cuda");
    EXPECT_EQ(result->implementation, "cuda-regression");
    EXPECT_TRUE(WithinTwiceNaive(result->output, naive, reference->output));
    EXPECT_TRUE(WithinTwiceNaive(result->weights, naive_w, reference->weights));
  }
}

// ---- resources ------------------------------------------------------------

TEST(CudaResourcesTest, ConcurrentCallersEachGetTheirOwnStream) {
  REQUIRE_GPU();
  std::mt19937 rng(15);
  const Tensor q = RandomNormal(rng, {4, 2, 200, 64});
  const Tensor k = RandomNormal(rng, {4, 2, 300, 64});
  const Tensor v = RandomNormal(rng, {4, 2, 300, 64});
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  auto reference = ReferenceEngine().ScaledDotProductAttention(request);
  ASSERT_TRUE(reference.ok());
  std::vector<std::thread> threads;
  std::vector<Tensor> outputs(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int call = 0; call < 5; ++call) {
        auto result = TheGpu().fused->ScaledDotProductAttention(request);
        if (result.ok()) outputs[t] = std::move(result->output);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Tensor& output : outputs) {
    EXPECT_TRUE(AllClose(output, reference->output, 1e-5, 1e-4));
  }
}

TEST(CudaResourcesTest, SteadyStateCallsReuseDeviceMemory) {
  REQUIRE_GPU();
  std::mt19937 rng(16);
  const Tensor a = RandomNormal(rng, {4, 128, 96});
  const Tensor b = RandomNormal(rng, {4, 96, 80});
  BatchMatmulRequest request{a.view(), b.view(), Precision::kFloat32};
  ASSERT_TRUE(TheGpu().fused->BatchMatmul(request).ok());
  const CudaBackend::MemoryStats warm = TheGpu().backend->memory_stats();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(TheGpu().fused->BatchMatmul(request).ok());
  const CudaBackend::MemoryStats after = TheGpu().backend->memory_stats();
  EXPECT_EQ(after.bytes_in_use + after.bytes_cached,
            warm.bytes_in_use + warm.bytes_cached)
      << "device memory grew across identical calls";
}

TEST(CudaResourcesTest, FusedAttentionMemoryIsLinearInLength) {
  REQUIRE_GPU();
  std::mt19937 rng(17);
  std::vector<int64_t> peaks;
  for (int64_t length : {1024, 4096}) {
    const Tensor q = RandomNormal(rng, {1, 4, length, 64});
    const Tensor k = RandomNormal(rng, {1, 4, length, 64});
    const Tensor v = RandomNormal(rng, {1, 4, length, 64});
    AttentionRequest request;
    request.queries = q.view();
    request.keys = k.view();
    request.values = v.view();
    TheGpu().backend->ResetPeakMemory();
    ASSERT_TRUE(TheGpu().fused->ScaledDotProductAttention(request).ok());
    peaks.push_back(TheGpu().backend->memory_stats().peak_bytes_in_use);
  }
  // 4x the length: inputs and output grow 4x; an (L x L) matrix would be 16x.
  EXPECT_LE(peaks[1], 5 * peaks[0]) << peaks[0] << " -> " << peaks[1];
}

}  // namespace
}  // namespace attn
