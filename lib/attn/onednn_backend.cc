#include "attn/onednn_backend.h"

#include <omp.h>

#include <array>
#include <deque>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "attn/bfloat16.h"
#include "attn/cpu_isa.h"
#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu_kernels.h"
#include "attn/status_macros.h"
#include "attn/work.h"

namespace attn {
namespace {

// Sets the OpenMP thread count of the calling thread's next parallel regions
// (oneDNN primitives and sgemm read it) and restores it on destruction. The
// setting is per thread, so concurrent calls do not disturb each other.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : previous_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedOmpThreads() { omp_set_num_threads(previous_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  const int previous_;
};

// Copies `count` floats rounded to `precision`'s operands.
std::vector<float> RoundedCopy(const float* data, int64_t count,
                               Precision precision) {
  std::vector<float> copy(data, data + count);
  for (float& value : copy) value = RoundOperand(value, precision);
  return copy;
}

// oneDNN's name for the instruction set its kernels dispatch to (what
// ONEDNN_MAX_CPU_ISA accepts).
const char* OneDnnIsaName(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

enum class PrimitiveKind : int64_t { kMatmul, kSoftmax };
using PrimitiveKey = std::array<int64_t, 5>;

}  // namespace

class OneDnnBackend::Impl {
 public:
  Impl(const Options& options, CpuIsa isa, dnnl::engine engine)
      : options_(options),
        max_threads_(options.max_threads > 0 ? options.max_threads
                                             : omp_get_max_threads()),
        isa_(isa),
        kernels_(internal::CpuKernelsFor(isa)),
        native_bfloat16_(internal::HasNativeBFloat16Products()),
        engine_(std::move(engine)) {}

  CpuIsa isa() const { return isa_; }
  bool native_bfloat16() const { return native_bfloat16_; }
  const internal::CpuKernels& kernels() const { return kernels_; }

  int ThreadsFor(double flops) const {
    return flops < options_.single_thread_below_flops ? 1 : max_threads_;
  }

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
  static dnnl::primitive_attr UserScratchpad() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  // Returns the cached primitive for `key`, creating it with `make` on a miss.
  template <typename Make>
  absl::StatusOr<Cached> GetOrCreate(const PrimitiveKey& key,
                                     const Make& make) {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    Cached primitive;
    try {
      primitive = make();
    } catch (const dnnl::error& e) {
      return absl::InternalError(
          absl::StrCat("oneDNN primitive creation failed: ", e.what()));
    }
    if (static_cast<int>(cache_.size()) >= options_.primitive_cache_capacity) {
      cache_.erase(insertion_order_.front());
      insertion_order_.pop_front();
    }
    cache_.emplace(key, primitive);
    insertion_order_.push_back(key);
    return primitive;
  }

  absl::Status Matmul(const float* a, const float* b, float* c, int64_t n,
                      int64_t m, int64_t k, int64_t p) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc a_md({n, m, k}, dt::f32, tag::abc);
    const dnnl::memory::desc b_md({n, k, p}, dt::f32, tag::abc);
    const dnnl::memory::desc c_md({n, m, p}, dt::f32, tag::abc);
    ASSIGN_OR_RETURN(
        Cached matmul,
        GetOrCreate({static_cast<int64_t>(PrimitiveKind::kMatmul), n, m, k, p},
                    [&] {
                      const dnnl::matmul::primitive_desc pd(
                          dnnl::matmul::desc(a_md, b_md, c_md),
                          UserScratchpad(), engine_);
                      return Cached{dnnl::matmul(pd), pd.scratchpad_desc()};
                    }));
    return Execute(matmul, {{DNNL_ARG_SRC, {a_md, a}},
                            {DNNL_ARG_WEIGHTS, {b_md, b}},
                            {DNNL_ARG_DST, {c_md, c}}});
  }

  absl::Status Softmax(const float* x, float* y, int64_t rows,
                       int64_t columns) {
    const dnnl::memory::desc md({rows, columns}, dnnl::memory::data_type::f32,
                                dnnl::memory::format_tag::ab);
    ASSIGN_OR_RETURN(
        Cached softmax,
        GetOrCreate(
            {static_cast<int64_t>(PrimitiveKind::kSoftmax), rows, columns, 0, 0},
            [&] {
              const dnnl::softmax_forward::primitive_desc pd(
                  dnnl::softmax_forward::desc(
                      dnnl::prop_kind::forward_inference, md, 1),
                  UserScratchpad(), engine_);
              return Cached{dnnl::softmax_forward(pd), pd.scratchpad_desc()};
            }));
    return Execute(softmax,
                   {{DNNL_ARG_SRC, {md, x}}, {DNNL_ARG_DST, {md, y}}});
  }

 private:
  struct Argument {
    dnnl::memory::desc desc;
    const float* data;
  };

  absl::Status Execute(const Cached& cached,
                       const std::vector<std::pair<int, Argument>>& arguments) {
    try {
      dnnl::stream stream(engine_);
      std::unordered_map<int, dnnl::memory> memories;
      for (const auto& [slot, argument] : arguments) {
        // oneDNN takes a non-const handle even for inputs; it never writes
        // to source or weights memory.
        memories.emplace(slot, dnnl::memory(argument.desc, engine_,
                                            const_cast<float*>(argument.data)));
      }
      // This thread's own scratchpad, kept between calls (a call runs on
      // one thread; oneDNN's OpenMP threads share it within the call).
      if (const size_t bytes = cached.scratchpad.get_size(); bytes > 0) {
        constexpr size_t kAlignment = 64;
        thread_local std::vector<char> scratchpad;
        if (scratchpad.size() < bytes + kAlignment) {
          scratchpad.resize(bytes + kAlignment);
        }
        void* aligned = scratchpad.data();
        size_t space = scratchpad.size();
        std::align(kAlignment, bytes, aligned, space);
        memories.emplace(DNNL_ARG_SCRATCHPAD,
                         dnnl::memory(cached.scratchpad, engine_, aligned));
      }
      cached.primitive.execute(stream, memories);
      stream.wait();
    } catch (const dnnl::error& e) {
      return absl::InternalError(
          absl::StrCat("oneDNN execution failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  const Options options_;
  const int max_threads_;
  const CpuIsa isa_;
  const internal::CpuKernels& kernels_;
  const bool native_bfloat16_;
  const dnnl::engine engine_;
  absl::Mutex mu_;
  absl::flat_hash_map<PrimitiveKey, Cached> cache_
      ABSL_GUARDED_BY(mu_);
  std::deque<PrimitiveKey> insertion_order_ ABSL_GUARDED_BY(mu_);
};

OneDnnBackend::OneDnnBackend(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

OneDnnBackend::~OneDnnBackend() = default;

absl::StatusOr<std::unique_ptr<OneDnnBackend>> OneDnnBackend::Create(
    const Options& options) {
  if (options.max_threads < 0 || options.primitive_cache_capacity < 1) {
    return absl::InvalidArgumentError(
        "max_threads must be >= 0 and primitive_cache_capacity >= 1");
  }
  ASSIGN_OR_RETURN(const CpuIsa isa, SelectCpuIsa(options.max_isa));
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return std::unique_ptr<OneDnnBackend>(new OneDnnBackend(
        std::make_unique<Impl>(options, isa, std::move(engine))));
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("cannot create the oneDNN CPU engine: ", e.what()));
  }
}

CpuIsa OneDnnBackend::isa() const { return impl_->isa(); }

std::string OneDnnBackend::description() const {
  return absl::StrCat(name(), " (own kernels: ", CpuIsaName(isa()),
                      "; oneDNN: ", OneDnnIsaName(dnnl::get_effective_cpu_isa()),
                      "; bf16 attention: ", bfloat16_attention(), ")");
}

const char* OneDnnBackend::bfloat16_attention() const {
  return impl_->native_bfloat16() ? "native" : "emulated";
}

bool OneDnnBackend::SpreadsKeysAcrossThreads(const AttentionParams& p) const {
  return p.lk >= 2 * kMinKeysPerShare;
}

absl::Status OneDnnBackend::MaskedSoftmax(const MaskedSoftmaxParams& p) {
  ScopedOmpThreads threads(impl_->ThreadsFor(EstimatedFlops(p)));
  if (p.valid.kind == ValidLengths::Kind::kNone) {
    return impl_->Softmax(p.x, p.out, p.batch * p.rows, p.columns);
  }
  impl_->kernels().masked_softmax(p, omp_get_max_threads());
  return absl::OkStatus();
}

absl::Status OneDnnBackend::BatchMatmul(const BatchMatmulParams& p) {
  ScopedOmpThreads threads(impl_->ThreadsFor(EstimatedFlops(p)));
  if (p.precision != Precision::kFloat32) {
    try {
      const std::vector<float> a = RoundedCopy(p.a, p.n * p.m * p.k, p.precision);
      const std::vector<float> b = RoundedCopy(p.b, p.n * p.k * p.p, p.precision);
      return impl_->Matmul(a.data(), b.data(), p.out, p.n, p.m, p.k, p.p);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("no memory for 16-bit operands");
    }
  }
  return impl_->Matmul(p.a, p.b, p.out, p.n, p.m, p.k, p.p);
}

absl::Status OneDnnBackend::ScaledDotProductAttention(
    const AttentionParams& p) {
  const int threads = impl_->ThreadsFor(EstimatedFlops(p));
  ScopedOmpThreads scoped(threads);
  if (p.precision == Precision::kBFloat16) {
    try {
      return impl_->kernels().attention(
          p,
          impl_->native_bfloat16() ? internal::BFloat16Mode::kNative
                                   : internal::BFloat16Mode::kEmulated,
          threads);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("no memory for 16-bit operands");
    }
  }
  if (p.precision != Precision::kFloat32) {
    try {
      const int64_t bh = p.batch * p.heads;
      const std::vector<float> q = RoundedCopy(p.q, bh * p.lq * p.d, p.precision);
      const std::vector<float> k = RoundedCopy(p.k, bh * p.lk * p.d, p.precision);
      const std::vector<float> v = RoundedCopy(p.v, bh * p.lk * p.dv, p.precision);
      AttentionParams rounded = p;
      rounded.q = q.data();
      rounded.k = k.data();
      rounded.v = v.data();
      return impl_->kernels().attention(rounded, internal::BFloat16Mode::kOff,
                                        threads);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("no memory for 16-bit operands");
    }
  }
  return impl_->kernels().attention(p, internal::BFloat16Mode::kOff, threads);
}

absl::Status OneDnnBackend::AdditiveAttention(
    const AdditiveAttentionParams& p) {
  const int threads = impl_->ThreadsFor(EstimatedFlops(p));
  ScopedOmpThreads scoped(threads);
  try {
    return impl_->kernels().additive_attention(p, threads);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("no memory for additive scratch");
  }
}

absl::Status OneDnnBackend::NadarayaWatson(const NadarayaWatsonParams& p) {
  const int threads = impl_->ThreadsFor(EstimatedFlops(p));
  ScopedOmpThreads scoped(threads);
  return impl_->kernels().nadaraya_watson(p, threads);
}

}  // namespace attn
