// oneDNN 2.6 primitives for whole operations (matmul, softmax), created once
// per shape and kept in a bounded cache, and the implementations that run
// them: onednn-matmul and onednn-softmax (one copy for every instruction
// set: oneDNN dispatches its own kernels).
//
// Thread safety: every method may be called concurrently. The cache is
// behind a mutex; each call executes its primitive on a stream of its own
// (CPU streams are cheap, and a shared stream would serialise unrelated
// calls) with a scratchpad of its own thread's. Methods block, and use the
// calling thread's OpenMP thread count. Status codes: INTERNAL when oneDNN
// fails to create or execute a primitive.
#ifndef ATTN_INTERNAL_CPU_ONEDNN_PRIMITIVES_H_
#define ATTN_INTERNAL_CPU_ONEDNN_PRIMITIVES_H_

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/params.h"

namespace attn::internal {

// onednn_softmax.cc, onednn_matmul.cc.
extern const CpuImplementation<MaskedSoftmaxParams> kOneDnnSoftmax;
extern const CpuImplementation<BatchMatmulParams> kOneDnnMatmul;

class OneDnnPrimitives {
 public:
  // `capacity`: distinct shapes whose primitives are kept (>= 1); the
  // oldest-inserted shape is dropped beyond it, so arbitrary client shapes
  // cannot grow memory.
  OneDnnPrimitives(dnnl::engine engine, int capacity);
  OneDnnPrimitives(const OneDnnPrimitives&) = delete;
  OneDnnPrimitives& operator=(const OneDnnPrimitives&) = delete;

  // Row-major c (n, m, p) = a (n, m, k) x b (n, k, p), float32.
  absl::Status Matmul(const float* a, const float* b, float* c, int64_t n,
                      int64_t m, int64_t k, int64_t p);
  // y = softmax of each row of x (rows, columns), float32.
  absl::Status Softmax(const float* x, float* y, int64_t rows,
                       int64_t columns);

 private:
  // A cached primitive and the scratchpad each execution must bring. The
  // primitives are made with scratchpad_mode::user: with the library's own
  // scratchpad, one primitive must not run on two threads at once (oneDNN's
  // scratchpad_mode docs), and the server's workers run the same cached
  // shape concurrently: two threads sharing one scratchpad gave a wrong
  // product once on an AVX-512 machine
  // (EngineConcurrencyTest.PrimitiveCacheUnderContention, under TSan).
  struct Cached {
    dnnl::primitive primitive;
    dnnl::memory::desc scratchpad;
  };
  // The primitive's kind and its shape.
  using Key = std::array<int64_t, 5>;
  struct Argument {
    dnnl::memory::desc desc;
    const float* data;
  };

  // Returns the cached primitive for `key`, creating it with `make` on a
  // miss.
  template <typename Make>
  absl::StatusOr<Cached> GetOrCreate(const Key& key, const Make& make);
  absl::Status Execute(const Cached& cached,
                       const std::vector<std::pair<int, Argument>>& arguments);

  const dnnl::engine engine_;
  const int capacity_;
  absl::Mutex mu_;
  absl::flat_hash_map<Key, Cached> cache_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> insertion_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_CPU_ONEDNN_PRIMITIVES_H_
