// Kernel benchmarks at the peer script's shapes (shared/bench/
// torch_attention_bench.py): GFLOP/s counted as the peer counts them (the
// nominal work, whatever the valid lengths skip) and the extra heap memory
// one call needs beyond its inputs and outputs.
//
// Run through bench/run_benchmarks.sh, which also runs the PyTorch peer and
// prints one table. OMP_NUM_THREADS sets the thread count (2 on the dev box).
// ATTN_BENCH_SKIPPED=name,name leaves those CPU implementations out of the
// engines here (EngineOptions::skipped_cpu_implementations), so that the
// next one in the list runs their calls: one kernel timed against the one
// it replaces, on the same machine.
#include <immintrin.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "absl/strings/str_split.h"
#include "attn/bfloat16.h"
#include "attn/engine.h"
#include "attn/pieces.h"
#include "attn/testing/random.h"
#include "benchmark/benchmark.h"

// Heap accounting: every malloc-family call of the process goes through
// these wrappers, so the oneDNN scratch and our own vectors are both seen.
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
std::atomic<int64_t> g_heap_bytes{0};
std::atomic<int64_t> g_heap_peak{0};

void Track(void* pointer, int sign) {
  if (pointer == nullptr) return;
  const int64_t now =
      g_heap_bytes.fetch_add(sign * static_cast<int64_t>(malloc_usable_size(pointer))) +
      sign * static_cast<int64_t>(malloc_usable_size(pointer));
  int64_t peak = g_heap_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

extern "C" {
void* malloc(size_t size) {
  void* p = __libc_malloc(size);
  Track(p, +1);
  return p;
}
void* calloc(size_t n, size_t size) {
  void* p = __libc_calloc(n, size);
  Track(p, +1);
  return p;
}
void* realloc(void* old, size_t size) {
  Track(old, -1);
  void* p = __libc_realloc(old, size);
  Track(p, +1);
  return p;
}
void free(void* p) {
  Track(p, -1);
  __libc_free(p);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  *out = __libc_memalign(alignment, size);
  Track(*out, +1);
  return *out == nullptr ? ENOMEM : 0;
}
void* aligned_alloc(size_t alignment, size_t size) {
  void* p = __libc_memalign(alignment, size);
  Track(p, +1);
  return p;
}
void* memalign(size_t alignment, size_t size) {
  void* p = __libc_memalign(alignment, size);
  Track(p, +1);
  return p;
}
}

namespace attn {
namespace {

using ::attn::testing::RandomNormal;

// EngineOptions with ATTN_BENCH_SKIPPED's implementations left out.
EngineOptions BenchOptions() {
  EngineOptions options;
  if (const char* skipped = std::getenv("ATTN_BENCH_SKIPPED")) {
    options.skipped_cpu_implementations =
        absl::StrSplit(skipped, ',', absl::SkipEmpty());
  }
  return options;
}

Engine& SharedEngine() {
  static Engine* engine = Engine::Create(BenchOptions()).value().release();
  return *engine;
}

// Bytes allocated at the peak of `call`, less what it returns (outputs). The
// call runs on a fresh thread, so per-thread buffers the kernels keep between
// calls start empty and are counted.
template <typename Call>
double ExtraMiB(const Call& call, int64_t output_bytes) {
  const int64_t before = g_heap_bytes.load();
  g_heap_peak.store(before);
  std::thread([&] { call(); }).join();
  const int64_t extra = g_heap_peak.load() - before - output_bytes;
  return std::max<int64_t>(extra, 0) / (1024.0 * 1024.0);
}

// The valid lengths the peer script draws (torch.Generator seeded 0), so the
// two skip the same amount of work.
const std::vector<int32_t> kMediumLengths = {
    6,  51, 28, 19, 34, 34, 48, 16, 52, 45, 29, 13, 42, 34, 46, 34,
    1,  43, 4,  17, 47, 31, 44, 50, 50, 5,  5,  4,  38, 19, 13, 27};
const std::vector<int32_t> kLargeLengths = {477, 265, 354, 388,
                                            258, 86,  233, 135};
const std::vector<int32_t> kLongLengths = {619};
const std::vector<int32_t> kAdditiveLengths = {
    32, 16, 13, 59, 59, 47, 16, 3,  31, 26, 57, 30, 39, 19, 14, 9,
    51, 24, 49, 5,  8,  34, 30, 43, 4,  24, 10, 63, 47, 35, 9,  58};

// args: batch, length, depth, lengths (0 none, 1 peer's), weights,
// precision (0 fp32, 1 bf16), causal.
void BM_Attention(benchmark::State& state) {
  const int64_t batch = state.range(0), length = state.range(1),
                depth = state.range(2);
  const bool peer_lengths = state.range(3) != 0;
  std::mt19937 rng(0);
  const Tensor q = RandomNormal(rng, {batch, length, depth});
  const Tensor k = RandomNormal(rng, {batch, length, depth});
  const Tensor v = RandomNormal(rng, {batch, length, depth});
  const std::vector<int32_t>& lengths =
      batch == 32 ? kMediumLengths : batch == 8 ? kLargeLengths : kLongLengths;
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  if (peer_lengths) request.valid_lens = LengthsView{lengths.data(), {batch}};
  request.return_weights = state.range(4) != 0;
  request.precision =
      state.range(5) != 0 ? Precision::kBFloat16 : Precision::kFloat32;
  request.causal = state.range(6) != 0;
  Engine& engine = SharedEngine();
  auto call = [&] {
    auto result = engine.ScaledDotProductAttention(request);
    if (!result.ok()) state.SkipWithError(result.status().ToString().c_str());
    benchmark::DoNotOptimize(result);
  };
  call();  // warm-up: primitive creation, page faults
  const int64_t output_bytes =
      4 * batch * length * depth +
      (request.return_weights ? 4 * batch * length * length : 0);
  const double extra = ExtraMiB(call, output_bytes);
  for (auto _ : state) call();
  const double flops = 4.0 * batch * length * length * depth;
  state.counters["GFLOPs"] = benchmark::Counter(
      flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["extra_MiB"] = extra;
  if (request.precision == Precision::kBFloat16) {
    // Which bfloat16 path ran: "native" products or "emulated" (rounded
    // operands, float32 products), as the backend's description says.
    const std::string description = engine.backend_descriptions().front();
    state.SetLabel(description.find("bf16 attention: native") != std::string::npos
                       ? "bf16 native"
                       : "bf16 emulated");
  }
}

void BM_Additive(benchmark::State& state) {
  const int64_t batch = 32, length = 64, depth = 64, hidden = 64;
  std::mt19937 rng(0);
  const Tensor q = RandomNormal(rng, {batch, length, depth});
  const Tensor k = RandomNormal(rng, {batch, length, depth});
  const Tensor v = RandomNormal(rng, {batch, length, depth});
  const Tensor w_q = RandomNormal(rng, {hidden, depth});
  const Tensor w_k = RandomNormal(rng, {hidden, depth});
  const Tensor w_v = RandomNormal(rng, {hidden});
  AdditiveAttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.w_q = w_q.view();
  request.w_k = w_k.view();
  request.w_v = w_v.view();
  request.valid_lens = LengthsView{kAdditiveLengths.data(), {batch}};
  Engine& engine = SharedEngine();
  auto call = [&] {
    auto result = engine.AdditiveAttention(request);
    if (!result.ok()) state.SkipWithError(result.status().ToString().c_str());
    benchmark::DoNotOptimize(result);
  };
  call();
  const double extra = ExtraMiB(call, 4 * batch * length * depth);
  for (auto _ : state) call();
  // The peer script's count.
  const double flops = 2.0 * batch * length * depth * hidden * 2 +
                       4.0 * batch * length * length * hidden +
                       2.0 * batch * length * length * depth;
  state.counters["GFLOPs"] = benchmark::Counter(
      flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["extra_MiB"] = extra;
}

void BM_NadarayaWatson(benchmark::State& state) {
  const int64_t n = 4096;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
  Tensor x_train = Tensor::Zeros({n}), y_train = Tensor::Zeros({n}),
         x_query = Tensor::Zeros({n});
  for (float& x : x_train.data) x = uniform(rng);
  std::sort(x_train.data.begin(), x_train.data.end());
  for (int64_t i = 0; i < n; ++i) {
    y_train.data[i] = 2 * std::sin(x_train.data[i]) + std::pow(x_train.data[i], 0.8f);
    x_query.data[i] = uniform(rng);
  }
  NadarayaWatsonRequest request;
  request.x_train = x_train.view();
  request.y_train = y_train.view();
  request.x_query = x_query.view();
  Engine& engine = SharedEngine();
  auto call = [&] {
    auto result = engine.NadarayaWatson(request);
    if (!result.ok()) state.SkipWithError(result.status().ToString().c_str());
    benchmark::DoNotOptimize(result);
  };
  call();
  const double extra = ExtraMiB(call, 4 * n);
  for (auto _ : state) call();
  state.counters["GFLOPs"] = benchmark::Counter(
      6.0 * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["extra_MiB"] = extra;
}

// A stored memory of N keys and values (d = v = 64) and Q queries for it,
// seeded; the keys and values also as bfloat16 bits (a memory stored as
// BF16).
struct Memory {
  static constexpr int64_t kDepth = 64;
  Memory(int64_t queries, int64_t n) {
    std::mt19937 rng(0);
    q = RandomNormal(rng, {1, queries, kDepth});
    k = RandomNormal(rng, {1, n, kDepth});
    v = RandomNormal(rng, {1, n, kDepth});
    k_bits.resize(k.data.size());
    v_bits.resize(v.data.size());
    for (size_t i = 0; i < k_bits.size(); ++i) {
      k_bits[i] = BFloat16Bits(k.data[i]);
      v_bits[i] = BFloat16Bits(v.data[i]);
    }
  }
  // The queries over rows [begin, end), read as float32 or as the bfloat16
  // bits (computed in bfloat16).
  AttentionRequest Over(int64_t begin, int64_t end, bool bfloat16) const {
    const int64_t d = kDepth;
    AttentionRequest request;
    request.queries = q.view();
    request.keys = TensorView{k.data.data() + begin * d, {1, end - begin, d}};
    request.values = TensorView{v.data.data() + begin * d, {1, end - begin, d}};
    if (bfloat16) {
      request.precision = Precision::kBFloat16;
      request.keys.data = request.values.data = nullptr;
      request.keys_bfloat16 = k_bits.data() + begin * d;
      request.values_bfloat16 = v_bits.data() + begin * d;
    }
    return request;
  }
  Tensor q, k, v;
  std::vector<uint16_t> k_bits, v_bits;
};

// An engine of one thread (a server worker's default) or two (a call's keys
// shared out between them), made once.
Engine& MemoryEngine(int threads) {
  static Engine* const engines[2] = {
      [] {
        EngineOptions options = BenchOptions();
        options.max_threads = 1;
        return Engine::Create(options).value().release();
      }(),
      [] {
        EngineOptions options = BenchOptions();
        options.max_threads = 2;
        return Engine::Create(options).value().release();
      }()};
  return *engines[threads == 2 ? 1 : 0];
}

// Queries against a stored memory, as the server runs them (one batch entry,
// one or two threads): Q query rows of d = 64 against N keys and values held
// as float32, or as bfloat16 bits (a memory stored as BF16, computed in
// bfloat16). memory_GBps: the keys' and values' bytes read per second.
void BM_MemoryQuery(benchmark::State& state) {
  const int64_t queries = state.range(0), n = state.range(1);
  const int64_t d = Memory::kDepth;
  const bool bfloat16 = state.range(2) != 0;
  const Memory memory(queries, n);
  const AttentionRequest request = memory.Over(0, n, bfloat16);
  Engine& engine = MemoryEngine(state.range(3));
  for (auto _ : state) {
    auto result = engine.ScaledDotProductAttention(request);
    if (!result.ok()) state.SkipWithError(result.status().ToString().c_str());
    benchmark::DoNotOptimize(result);
  }
  state.counters["memory_GBps"] = benchmark::Counter(
      2.0 * n * d * (bfloat16 ? 2 : 4) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
  // Both products, a multiply and an add per term; BM_ArithmeticPeak gives
  // the core's ceiling to hold it against.
  state.counters["GFLOPs"] = benchmark::Counter(
      4.0 * queries * n * d * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// The same memory cut into `pieces` pieces of about equal rows (rows
// appended at different times), each attended alone asking for its rows'
// log-sum-exp, and the answers merged (attn/pieces.h), on one thread.
// pieces 0: the same rows in one call that asks for nothing more, as a
// memory in one piece runs; BM_MemoryQuery's arguments otherwise.
void BM_MemoryPieces(benchmark::State& state) {
  const int64_t queries = state.range(0), n = state.range(1);
  const int64_t pieces = state.range(2);
  const bool bfloat16 = state.range(3) != 0;
  const Memory memory(queries, n);
  Engine& engine = MemoryEngine(1);
  const int64_t calls = std::max<int64_t>(pieces, 1);
  std::vector<AttentionRequest> requests;
  for (int64_t i = 0; i < calls; ++i) {
    requests.push_back(
        memory.Over(n * i / calls, n * (i + 1) / calls, bfloat16));
    requests.back().return_log_sum_exp = pieces > 0;
  }
  std::vector<OpResult> answers(requests.size());
  std::vector<AttentionPiece> views(requests.size());
  for (auto _ : state) {
    for (size_t i = 0; i < requests.size(); ++i) {
      auto answer = engine.ScaledDotProductAttention(requests[i]);
      if (!answer.ok()) {
        state.SkipWithError(answer.status().ToString().c_str());
        return;
      }
      answers[i] = *std::move(answer);
      views[i] = {answers[i].output.view(), answers[i].log_sum_exp.view(), {}};
    }
    if (pieces > 0) {
      auto merged = MergeAttentionPieces(views);
      if (!merged.ok()) {
        state.SkipWithError(merged.status().ToString().c_str());
        return;
      }
      benchmark::DoNotOptimize(merged);
    }
    benchmark::DoNotOptimize(answers);
  }
  state.counters["memory_GBps"] = benchmark::Counter(
      2.0 * n * Memory::kDepth * (bfloat16 ? 2 : 4) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// The core's arithmetic ceiling, for BM_MemoryQuery's GFLOPs to be read
// against: twelve independent chains of float32 FMAs, 512-bit where the CPU
// has AVX-512 and 256-bit where it has AVX2 alone (arg 0), or of
// VDPBF16PS, two bfloat16 products a float32 lane (arg 1), the instructions
// the lane kernel runs. A CPU without them is skipped, saying which.
constexpr int64_t kPeakSteps = 1 << 20;

// (A macro, not a template: the three bodies need different target
// attributes, which GCC does not let an inlined helper take on.)
#define ATTN_PEAK_CHAINS(ZERO, STEP)                                       \
  auto a0 = ZERO, a1 = a0, a2 = a0, a3 = a0, a4 = a0,                      \
         a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0; \
  for (int64_t i = 0; i < kPeakSteps; ++i) {                               \
    a0 = STEP(a0), a1 = STEP(a1), a2 = STEP(a2), a3 = STEP(a3);            \
    a4 = STEP(a4), a5 = STEP(a5), a6 = STEP(a6), a7 = STEP(a7);            \
    a8 = STEP(a8), a9 = STEP(a9), a10 = STEP(a10), a11 = STEP(a11);        \
    /* Keeps the chains in registers and every step alive. */             \
    __asm__ volatile(""                                                    \
                     : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4),   \
                       "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9),   \
                       "+v"(a10), "+v"(a11));                              \
  }                                                                        \
  const auto sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 +  \
                   a11;                                                    \
  return sum[0]

__attribute__((target("avx512f"))) float FloatFmaChains() {
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
#define ATTN_FMA_STEP(a) _mm512_fmadd_ps(a, x, y)
  ATTN_PEAK_CHAINS(_mm512_setzero_ps(), ATTN_FMA_STEP);
#undef ATTN_FMA_STEP
}

// The same on 256-bit vectors, for CPUs with AVX2 alone.
__attribute__((target("avx2,fma"))) float FloatFma256Chains() {
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
#define ATTN_FMA_STEP(a) _mm256_fmadd_ps(a, x, y)
  ATTN_PEAK_CHAINS(_mm256_setzero_ps(), ATTN_FMA_STEP);
#undef ATTN_FMA_STEP
}

__attribute__((target("avx512f,avx512bf16"))) float BFloat16DotChains() {
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f);
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x38d138d1);
#define ATTN_DOT_STEP(a) _mm512_dpbf16_ps(a, x, y)
  ATTN_PEAK_CHAINS(_mm512_setzero_ps(), ATTN_DOT_STEP);
#undef ATTN_DOT_STEP
}
#undef ATTN_PEAK_CHAINS

void BM_ArithmeticPeak(benchmark::State& state) {
  const bool bfloat16 = state.range(0) != 0;
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (bfloat16 ? !(avx512 && __builtin_cpu_supports("avx512bf16"))
               : !(avx512 || (__builtin_cpu_supports("avx2") &&
                              __builtin_cpu_supports("fma")))) {
    state.SkipWithError(bfloat16 ? "no AVX512-BF16 on this CPU"
                                 : "no AVX2 with FMA on this CPU");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(bfloat16 ? BFloat16DotChains()
                             : avx512 ? FloatFmaChains()
                                      : FloatFma256Chains());
  }
  // 12 chains x lanes x (2 flops, or 2 products of 2 flops).
  const int lanes = avx512 ? 16 : 8;
  state.counters["GFLOPs"] = benchmark::Counter(
      kPeakSteps * 12.0 * lanes * (bfloat16 ? 4 : 2) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// The AMX ceiling the bfloat16 cases are held against: oneDNN's own bf16
// matmuls (brgemm on AMX tiles where the CPU has them) of attention's two
// products at the case's sizes, Q K^T into float32 scores and then bf16
// probabilities times V, back to back and nothing else: what the tile unit
// reaches on these shapes through a tuned library, with no softmax, masks,
// operand rounding or validation. GFLOP/s counted as BM_Attention's.
void BM_AmxCeiling(benchmark::State& state) {
  using dt = dnnl::memory::data_type;
  const int64_t batch = state.range(0), length = state.range(1),
                depth = state.range(2);
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  if ((isa & amx) != amx) {
    state.SkipWithError("no AMX for oneDNN on this CPU (or capped)");
    return;
  }
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::dims qkv = {batch, length, depth};
  const dnnl::memory::dims square = {batch, length, length};
  const dnnl::memory::desc q(qkv, dt::bf16, dnnl::memory::format_tag::abc);
  // K^T: the keys as stored (B, L, d), read transposed.
  const dnnl::memory::desc k_transposed({batch, depth, length}, dt::bf16,
                                        dnnl::memory::format_tag::acb);
  const dnnl::memory::desc scores(square, dt::f32,
                                  dnnl::memory::format_tag::abc);
  const dnnl::memory::desc probabilities(square, dt::bf16,
                                         dnnl::memory::format_tag::abc);
  const dnnl::memory::desc out(qkv, dt::f32, dnnl::memory::format_tag::abc);
  const dnnl::matmul first(dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(q, k_transposed, scores), engine));
  const dnnl::matmul second(dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(probabilities, q, out), engine));
  dnnl::memory q_memory(q, engine), k_memory(k_transposed, engine),
      v_memory(q, engine), s_memory(scores, engine),
      p_memory(probabilities, engine), o_memory(out, engine);
  // Small bfloat16 values (0.0078125): finite products, no denormals.
  for (dnnl::memory* m : {&q_memory, &k_memory, &v_memory, &p_memory}) {
    auto* bits = static_cast<uint16_t*>(m->get_data_handle());
    std::fill(bits, bits + m->get_desc().get_size() / 2, uint16_t{0x3c00});
  }
  auto call = [&] {
    first.execute(stream, {{DNNL_ARG_SRC, q_memory},
                           {DNNL_ARG_WEIGHTS, k_memory},
                           {DNNL_ARG_DST, s_memory}});
    second.execute(stream, {{DNNL_ARG_SRC, p_memory},
                            {DNNL_ARG_WEIGHTS, v_memory},
                            {DNNL_ARG_DST, o_memory}});
    stream.wait();
  };
  call();  // warm-up
  for (auto _ : state) call();
  state.counters["GFLOPs"] = benchmark::Counter(
      4.0 * batch * length * length * depth * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// The attention-scoring section's toy call: queries (2, 1, 2), keys
// (2, 10, 2), values (2, 10, 4), valid lengths [2, 6], through the Engine
// (validation and output allocation included).
void BM_Toy(benchmark::State& state) {
  std::mt19937 rng(0);
  const Tensor q = RandomNormal(rng, {2, 1, 2});
  const Tensor k = RandomNormal(rng, {2, 10, 2});
  const Tensor v = RandomNormal(rng, {2, 10, 4});
  const std::vector<int32_t> lengths = {2, 6};
  AttentionRequest request;
  request.queries = q.view();
  request.keys = k.view();
  request.values = v.view();
  request.valid_lens = LengthsView{lengths.data(), {2}};
  request.return_weights = state.range(0) != 0;
  Engine& engine = SharedEngine();
  for (auto _ : state) {
    auto result = engine.ScaledDotProductAttention(request);
    benchmark::DoNotOptimize(result);
  }
}

// batch, length, depth, peer lengths, weights, bf16, causal
BENCHMARK(BM_Attention)
    ->ArgNames({"B", "L", "d", "lens", "weights", "bf16", "causal"})
    ->Args({32, 64, 64, 1, 0, 0, 0})
    ->Args({32, 64, 64, 0, 0, 0, 0})
    ->Args({8, 512, 64, 1, 0, 0, 0})
    ->Args({8, 512, 64, 0, 0, 0, 0})
    ->Args({8, 512, 64, 1, 1, 0, 0})
    ->Args({8, 512, 64, 0, 1, 0, 0})
    ->Args({8, 512, 64, 0, 0, 1, 0})
    ->Args({8, 512, 64, 0, 0, 0, 1})
    ->Args({1, 4096, 64, 1, 0, 0, 0})
    ->Args({1, 4096, 64, 0, 0, 0, 0})
    // bfloat16 with the peer's lengths and at length 4096.
    ->Args({8, 512, 64, 1, 0, 1, 0})
    ->Args({1, 4096, 64, 0, 0, 1, 0})
    ->Args({1, 4096, 64, 1, 0, 1, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// queries, memory entries, bf16
BENCHMARK(BM_MemoryQuery)
    ->ArgNames({"Q", "N", "bf16", "threads"})
    ->Args({1, 4096, 0, 1})
    ->Args({1, 4096, 1, 1})
    ->Args({1, 262144, 0, 1})
    ->Args({1, 262144, 1, 1})
    ->Args({2, 262144, 0, 1})
    ->Args({2, 262144, 1, 1})
    ->Args({4, 262144, 0, 1})
    ->Args({4, 262144, 1, 1})
    ->Args({8, 262144, 0, 1})
    ->Args({8, 262144, 1, 1})
    ->Args({16, 262144, 0, 1})
    ->Args({16, 262144, 1, 1})
    ->Args({24, 262144, 1, 1})
    ->Args({32, 262144, 0, 1})
    ->Args({32, 262144, 1, 1})
    ->Args({64, 262144, 0, 1})
    ->Args({64, 262144, 1, 1})
    ->Args({128, 262144, 0, 1})
    ->Args({128, 262144, 1, 1})
    ->Args({16, 4096, 0, 1})
    ->Args({32, 4096, 0, 1})
    ->Args({64, 4096, 0, 1})
    ->Args({128, 4096, 0, 1})
    ->Args({128, 16384, 0, 1})
    ->Args({128, 32768, 0, 1})
    ->Args({128, 65536, 0, 1})
    ->Args({16, 4096, 1, 1})
    ->Args({24, 4096, 1, 1})
    ->Args({32, 4096, 1, 1})
    ->Args({64, 4096, 1, 1})
    ->Args({128, 4096, 1, 1})
    ->Args({1, 262144, 0, 2})
    ->Args({1, 262144, 1, 2})
    ->Args({1, 1048576, 0, 1})
    ->Args({1, 1048576, 0, 2})
    ->Args({16, 262144, 0, 2})
    ->Args({16, 262144, 1, 2})
    ->Args({32, 262144, 0, 2})
    ->Args({32, 262144, 1, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemoryPieces)
    ->ArgNames({"Q", "N", "pieces", "bf16"})
    ->Args({1, 262144, 0, 0})
    ->Args({1, 262144, 1, 0})
    ->Args({1, 262144, 2, 0})
    ->Args({1, 262144, 8, 0})
    ->Args({16, 262144, 0, 0})
    ->Args({16, 262144, 2, 0})
    ->Args({16, 262144, 8, 0})
    ->Args({64, 262144, 0, 1})
    ->Args({64, 262144, 2, 1})
    ->Args({64, 262144, 8, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ArithmeticPeak)
    ->ArgName("bf16")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// batch, length, depth: the large and long bf16 cases' sizes.
BENCHMARK(BM_AmxCeiling)
    ->ArgNames({"B", "L", "d"})
    ->Args({8, 512, 64})
    ->Args({1, 4096, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Additive)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NadarayaWatson)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Toy)->ArgName("weights")->Arg(0)->Arg(1)->UseRealTime()->Unit(
    benchmark::kMicrosecond);

}  // namespace
}  // namespace attn

BENCHMARK_MAIN();
