#include "attn/internal/block_matmul.h"

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace attn::internal {
namespace {

using dt = dnnl::memory::data_type;
constexpr dnnl::memory::dim kRuntime = DNNL_RUNTIME_DIM_VAL;

// Distinct recurring shapes kept; past it, recurring shapes run on the
// run-time-dimension primitives, so arbitrary client shapes cannot grow it.
constexpr size_t kShapeCacheCapacity = 64;

struct Primitive {
  dnnl::matmul matmul;
  size_t scratchpad_bytes = 0;
};

// The engine every block product runs on (oneDNN's CPU engine is stateless
// and shared freely between threads); nullptr if oneDNN cannot make one.
const dnnl::engine* Engine() {
  static const dnnl::engine* const engine = []() -> const dnnl::engine* {
    try {
      return new dnnl::engine(dnnl::engine::kind::cpu, 0);
    } catch (const dnnl::error&) {
      return nullptr;
    }
  }();
  return engine;
}

dt TypeOf(BlockOperands operands) {
  return operands == BlockOperands::kBFloat16 ? dt::bf16 : dt::f32;
}

struct Descs {
  dnnl::memory::desc a, b, c;
};

// Row-major descriptors of `p`; with `runtime`, every dimension and stride is
// left to execution time.
Descs DescsOf(const BlockProduct& p, bool runtime) {
  const auto dim = [&](int64_t value) { return runtime ? kRuntime : value; };
  const dt type = TypeOf(p.operands);
  Descs descs;
  descs.a = dnnl::memory::desc({dim(p.m), dim(p.k)}, type, {dim(p.lda), 1});
  descs.b = p.transpose_b
                ? dnnl::memory::desc({dim(p.k), dim(p.n)}, type, {1, dim(p.ldb)})
                : dnnl::memory::desc({dim(p.k), dim(p.n)}, type, {dim(p.ldb), 1});
  descs.c = dnnl::memory::desc({dim(p.m), dim(p.n)}, dt::f32, {dim(p.ldc), 1});
  return descs;
}

// Throws dnnl::error when oneDNN cannot make it.
Primitive MakePrimitive(const BlockProduct& p, bool runtime) {
  const Descs descs = DescsOf(p, runtime);
  dnnl::primitive_attr attr;
  // Each thread brings its own scratchpad: with oneDNN's, a primitive must
  // not run on two threads at once.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(descs.a, descs.b, descs.c), attr, *Engine());
  return Primitive{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
}

using ShapeKey = std::array<int64_t, 9>;

ShapeKey KeyOf(const BlockProduct& p) {
  return {static_cast<int64_t>(p.operands), p.transpose_b, p.accumulate,
          p.m, p.n, p.k, p.lda, p.ldb, p.ldc};
}

class PrimitiveCache {
 public:
  // The primitive compiled for p's shape, made on first use; nullopt when the
  // cache is full.
  std::optional<Primitive> ForShape(const BlockProduct& p) {
    const ShapeKey key = KeyOf(p);
    {
      absl::ReaderMutexLock lock(&mu_);
      if (auto it = shapes_.find(key); it != shapes_.end()) return it->second;
      if (shapes_.size() >= kShapeCacheCapacity) return std::nullopt;
    }
    // Made outside the lock (it can take milliseconds); two threads racing
    // on a new shape both make it and the first one in is kept.
    Primitive made = MakePrimitive(p, /*runtime=*/false);
    absl::MutexLock lock(&mu_);
    if (shapes_.size() >= kShapeCacheCapacity) return made;
    return shapes_.try_emplace(key, std::move(made)).first->second;
  }

  // The run-time-dimension primitive for p's operand type, transposition and
  // accumulation.
  Primitive ForAnyShape(const BlockProduct& p) {
    const int index = static_cast<int>(p.operands) * 4 + p.transpose_b * 2 +
                      p.accumulate;
    {
      absl::ReaderMutexLock lock(&mu_);
      if (runtime_[index].has_value()) return *runtime_[index];
    }
    Primitive made = MakePrimitive(p, /*runtime=*/true);
    absl::MutexLock lock(&mu_);
    if (!runtime_[index].has_value()) runtime_[index] = std::move(made);
    return *runtime_[index];
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<ShapeKey, Primitive> shapes_ ABSL_GUARDED_BY(mu_);
  std::array<std::optional<Primitive>, 8> runtime_ ABSL_GUARDED_BY(mu_);
};

PrimitiveCache& Cache() {
  static PrimitiveCache* const cache = new PrimitiveCache;
  return *cache;
}

// A primitive with its arguments bound: executing it again on new data only
// swaps the data handles (making memory objects and the argument map costs
// about 1 us a product, 5% of a full block).
struct Bound {
  dnnl::matmul matmul;
  std::unordered_map<int, dnnl::memory> args;
};

// What one thread keeps between products: its scratchpad and the recurring
// shapes it has run, bound to it.
class ThreadState {
 public:
  // The bound execution of p's recurring shape, if it has been bound here.
  Bound* Find(const ShapeKey& key) {
    auto it = shapes_.find(key);
    return it == shapes_.end() ? nullptr : &it->second;
  }

  Bound* Keep(const ShapeKey& key, Bound bound) {
    if (shapes_.size() >= kShapeCacheCapacity) shapes_.clear();
    return &shapes_.try_emplace(key, std::move(bound)).first->second;
  }

  // A 64-byte aligned scratchpad of at least `bytes`. Growing it moves it,
  // which unbinds every kept shape.
  void* Scratchpad(size_t bytes) {
    constexpr size_t kAlignment = 64;
    if (buffer_.size() < bytes + kAlignment) {
      shapes_.clear();
      buffer_.resize(bytes + kAlignment);
    }
    void* aligned = buffer_.data();
    size_t space = buffer_.size();
    return std::align(kAlignment, bytes, aligned, space);
  }

 private:
  std::vector<char> buffer_;
  absl::flat_hash_map<ShapeKey, Bound> shapes_;
};

ThreadState& ThisThread() {
  thread_local ThreadState state;
  return state;
}

Bound Bind(const dnnl::engine& engine, const Primitive& primitive,
           const BlockProduct& p) {
  const Descs descs = DescsOf(p, /*runtime=*/false);
  Bound bound{primitive.matmul,
              {{DNNL_ARG_SRC, dnnl::memory(descs.a, engine, nullptr)},
               {DNNL_ARG_WEIGHTS, dnnl::memory(descs.b, engine, nullptr)},
               {DNNL_ARG_DST, dnnl::memory(descs.c, engine, nullptr)}}};
  if (primitive.scratchpad_bytes > 0) {
    bound.args.emplace(
        DNNL_ARG_SCRATCHPAD,
        dnnl::memory(dnnl::memory::desc(
                         {static_cast<int64_t>(primitive.scratchpad_bytes)},
                         dt::u8, {1}),
                     engine, ThisThread().Scratchpad(primitive.scratchpad_bytes)));
  }
  return bound;
}

bool Execute(const dnnl::engine& engine, Bound& bound, const void* a,
             const void* b, float* c) {
  // oneDNN takes non-const handles; it never writes to A or B.
  bound.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<void*>(a));
  bound.args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<void*>(b));
  bound.args.at(DNNL_ARG_DST).set_data_handle(c);
  thread_local dnnl::stream stream(engine);
  bound.matmul.execute(stream, bound.args);
  stream.wait();
  return true;
}

}  // namespace

bool RunBlockProduct(const BlockProduct& p, bool recurring, const void* a,
                     const void* b, float* c) {
  if (p.m == 0 || p.n == 0) return true;
  if (!recurring && p.operands == BlockOperands::kFloat32) {
    // A one-off float32 product: sgemm's call costs ~0.2 us where a
    // primitive's costs ~1 us, which toy calls would feel.
    return dnnl_sgemm('N', p.transpose_b ? 'T' : 'N', p.m, p.n, p.k, 1.0f,
                      static_cast<const float*>(a), p.lda,
                      static_cast<const float*>(b), p.ldb,
                      p.accumulate ? 1.0f : 0.0f, c, p.ldc) == dnnl_success;
  }
  const dnnl::engine* engine = Engine();
  if (engine == nullptr) return false;
  try {
    if (recurring) {
      const ShapeKey key = KeyOf(p);
      if (Bound* bound = ThisThread().Find(key)) {
        return Execute(*engine, *bound, a, b, c);
      }
      if (std::optional<Primitive> primitive = Cache().ForShape(p)) {
        // Bind first: binding may grow the scratchpad, which clears the
        // kept shapes.
        Bound bound = Bind(*engine, *primitive, p);
        return Execute(*engine, *ThisThread().Keep(key, std::move(bound)), a,
                       b, c);
      }
    }
    Bound bound = Bind(*engine, Cache().ForAnyShape(p), p);
    return Execute(*engine, bound, a, b, c);
  } catch (const dnnl::error&) {
    return false;
  }
}

bool HasNativeBFloat16Products() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

bool HasAmxProducts() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (isa & amx) == amx;
}

}  // namespace attn::internal
