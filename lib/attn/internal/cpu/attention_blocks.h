// What the CPU attention implementations share (cpu-weights-blocks,
// cpu-key-shares, cpu-lane, cpu-fused-blocks): the operands their products
// read (the float32 inputs, or bfloat16 copies of them), the task grid
// (blocks of query rows of each batch entry and head), the block products,
// per-thread scratch, and the partial softmax a share of a task's keys
// leaves.
//
// Internal to the kernel sources: include it inside the ISA region
// (attn/internal/isa.h), after vec_math.h, with <algorithm>, <atomic>,
// <cstdint>, <limits>, <memory>, <vector>, attn/internal/aligned_vector.h,
// attn/internal/block_matmul.h, attn/internal/cpu/implementation.h and
// attn/params.h included before the region.
#ifndef ATTN_INTERNAL_CPU_ATTENTION_BLOCKS_H_
#define ATTN_INTERNAL_CPU_ATTENTION_BLOCKS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "attn/internal/aligned_vector.h"
#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/cpu/kernel_copy.h"
#include "attn/internal/isa.h"
#include "attn/internal/vec_math.h"
#include "attn/params.h"

namespace attn::internal::ATTN_ISA_NAMESPACE {

// Rows of queries one task owns, and keys per online-softmax step: a
// 128 x 256 score block, a 256-row key block, a 256-row value block and the
// 128-row accumulator stay inside a 512 KiB L2 for d, dv <= 128. 128 rows
// rather than 64: brgemm re-packs a key block for every product, and 128
// rows halve that (4-8% faster at full work, AMD EPYC with AVX-512; causal
// masks skip at a coarser grain, ~equal).
inline constexpr int64_t kQueryBlock = 128;
inline constexpr int64_t kKeyBlock = 256;
// Keys from which a call counts as over many keys (a stored memory's): the
// lane kernel and compiled block shapes for fewer rows than a query block.
inline constexpr int64_t kManyKeys = 16 * kKeyBlock;
// bfloat16 products with at most this many rows run on BFloat16Product
// (one row on vector loops over the bits, more widened to float32 for
// sgemm): oneDNN binds a run-time-shaped bfloat16 primitive per key block,
// microseconds that a single query's block (1 x 256 x 64) does not repay.
inline constexpr int64_t kFewRows = 4;
// The fewest rows of a float32 product the avx512 copy runs on its own,
// and the most keys of a scores product it does (Product()).
inline constexpr int64_t kOwnProductRows = 16;
inline constexpr int64_t kOwnProductKeys = 64;

inline constexpr float kNegativeInfinity =
    -std::numeric_limits<float>::infinity();

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

// Whether the call's products read bfloat16: Precision::kBFloat16 where the
// CPU multiplies bfloat16 (copies of Q, K and V, both products in bfloat16
// with float32 accumulation, softmax in float32 and its probabilities
// rounded for the second product, as PyTorch's and oneDNN Graph's bf16
// attention do), or keys and values held as bfloat16 on any CPU (widened a
// block at a time: Operands::own_products). Elsewhere kBFloat16 multiplies,
// in float32, the floats its operands round to.
bool BFloat16Operands(const CpuCall<AttentionParams>& call);

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

// The operands of one call (BFloat16Operands says which), rounded on
// construction where the call's precision asks for it; valid while this
// object lives.
class AttentionOperands {
 public:
  explicit AttentionOperands(const CpuCall<AttentionParams>& call);
  AttentionOperands(const AttentionOperands&) = delete;
  AttentionOperands& operator=(const AttentionOperands&) = delete;

  const Operands& get() const { return operands_; }

 private:
  RoundedOperands<uint16_t> rounded_;
  RoundedOperands<float> emulated_;
  Operands operands_;
};

// A task: `rows` query rows from q0 of batch entry and head bh
// (bh = b * heads + h), at most kQueryBlock of them.
struct Task {
  int64_t bh = 0;
  int64_t q0 = 0;
  int64_t rows = 0;
};

inline int64_t QueryBlocks(const AttentionParams& p) {
  return (p.lq + kQueryBlock - 1) / kQueryBlock;
}
inline int64_t TaskCount(const AttentionParams& p) {
  return p.batch * p.heads * QueryBlocks(p);
}
inline Task TaskAt(const AttentionParams& p, int64_t index) {
  const int64_t query_blocks = QueryBlocks(p);
  const int64_t q0 = (index % query_blocks) * kQueryBlock;
  return Task{index / query_blocks, q0, std::min(kQueryBlock, p.lq - q0)};
}

// Writes the number of keys each of the task's rows attends to,
// limit[r] = p.KeyLimit(b, q0 + r), and returns the largest.
int64_t RowLimits(const AttentionParams& p, const Task& task, int64_t* limit);

// AttentionParams::log_sum_exp of query row `row` (bh * lq + i), from the
// raw-score max and the sum of exp((score - max) * scale) a kernel kept
// (a sum of 0: no key, -inf). In double; for the Gaussian score it puts
// back the -|q|^2 / 2 the kernels leave out of their scores (constant along
// a row, it cancels in the softmax), of q as the products read it.
float RowLogSumExp(const AttentionParams& p, const Operands& ops, int64_t row,
                   float max, double sum);

// A share of one task's keys, [begin, end) with begin a multiple of
// kKeyBlock, for calls with fewer tasks than threads (cpu-key-shares): the
// pass over a share leaves each row's raw-score max, sum of exponentials
// and unnormalised output in max, sum and acc (rows, rows, rows x dv), and
// the shares are merged.
struct KeyShare {
  int64_t begin = 0;
  int64_t end = 0;
  float* max = nullptr;
  float* sum = nullptr;
  float* acc = nullptr;
};

// Per-thread buffers of the blocked kernels, sized for the call (a toy
// call must not pay for full-size blocks).
struct Scratch {
  int64_t key_block = 0;       // min(kKeyBlock, lk): the row stride of scores
  AlignedVector<float> scores;      // query block x key_block
  AlignedVector<uint16_t> rounded;  // bfloat16 probabilities: scores'
                                    // shape, or query block x lk with weights
  AlignedVector<float> acc;         // kQueryBlock x dv
  std::vector<float> max;      // kQueryBlock
  std::vector<float> sum;      // kQueryBlock
  std::vector<float> norms;    // key_block
  std::vector<int64_t> limit;  // kQueryBlock
  // Set by a block that checks what it writes (cpu-fused-blocks) when an
  // output it wrote is not finite.
  bool wrote_nonfinite = false;
};

// A Scratch for the blocked kernels on `p`, whose products read bfloat16
// where `bfloat16` is set.
Scratch MakeScratch(const AttentionParams& p, bool bfloat16);

// One block product of the attention kernels: widened to float32 for
// bfloat16 operands with few rows (or Operands::own_products); in the
// avx512 copy, float32 products of kOwnProductRows rows or more that are
// not `recurring` (scores over at most kOwnProductKeys keys) on its own
// register-blocked product (small_product_avx512.h); else oneDNN's
// (attn/internal/block_matmul.h).
// False when oneDNN fails.
bool Product(const Operands& ops, const BlockProduct& product, bool recurring,
             const void* a, const void* b, float* c);

// Gaussian score: -scale * ||q - k||^2 / 2 = scale * (q.k - ||k||^2 / 2 -
// ||q||^2 / 2). The last term is constant along a softmax row, so it is
// dropped; half the key's squared norm is subtracted from each raw dot
// product (the scale is applied in the exponential's argument).
void SubtractKeyNorms(const Operands& ops, const void* keys, int64_t count,
                      int64_t d, float* scores, int64_t rows, int64_t ld,
                      float* norms);

// Runs body(item, scratch) for item in [0, items) on `threads` OpenMP
// threads (dynamic scheduling: masks make items uneven), each thread with a
// scratch of its own from make_scratch(). Returns false when a body did.
template <typename MakeScratch, typename Body>
bool ForEachItem(int64_t items, int threads, const MakeScratch& make_scratch,
                 const Body& body) {
  std::atomic<bool> failed{false};
  if (threads <= 1 || items <= 1) {
    auto scratch = make_scratch();
    for (int64_t item = 0; item < items; ++item) {
      if (!body(item, scratch)) failed.store(true, std::memory_order_relaxed);
    }
  } else {
#pragma omp parallel num_threads(threads)
    {
      auto scratch = make_scratch();
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < items; ++item) {
        if (!body(item, scratch)) {
          failed.store(true, std::memory_order_relaxed);
        }
      }
    }
  }
  return !failed.load();
}

// Runs block(p, ops, task, scratch) for every task of the call, on its
// threads, each thread with blocked-kernel Scratch of its own: the whole run
// of the implementations that differ only in their block (cpu-fused-blocks,
// cpu-weights-blocks). Blocks; INTERNAL when a block reports oneDNN failing.
// Where the block checks its outputs (Scratch::wrote_nonfinite) and every
// one was finite, says so (AttentionParams::outputs_finite).
template <typename Block>
absl::Status RunEveryTask(const CpuCall<AttentionParams>& call,
                          const Block& block, bool block_checks_outputs) {
  const AttentionParams& p = call.params;
  const AttentionOperands operands(call);
  const Operands& ops = operands.get();
  std::atomic<bool> nonfinite{false};
  const bool ok = ForEachItem(
      TaskCount(p), call.threads,
      [&] { return MakeScratch(p, ops.type == BlockOperands::kBFloat16); },
      [&](int64_t task, Scratch& scratch) {
        const bool done = block(p, ops, TaskAt(p, task), scratch);
        if (scratch.wrote_nonfinite) {
          nonfinite.store(true, std::memory_order_relaxed);
        }
        return done;
      });
  if (!ok) return absl::InternalError("oneDNN matmul failed");
  if (block_checks_outputs && !nonfinite.load() &&
      p.outputs_finite != nullptr) {
    *p.outputs_finite = true;
  }
  return absl::OkStatus();
}

}  // namespace attn::internal::ATTN_ISA_NAMESPACE

#endif  // ATTN_INTERNAL_CPU_ATTENTION_BLOCKS_H_
