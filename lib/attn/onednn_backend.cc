#include "attn/onednn_backend.h"

#include <omp.h>

#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attn/bfloat16.h"
#include "attn/cpu_isa.h"
#include "attn/internal/block_matmul.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/cpu/implementation_lists.h"
#include "attn/internal/cpu/onednn_primitives.h"
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

}  // namespace

class OneDnnBackend::Impl {
 public:
  Impl(const Options& options, CpuIsa isa, dnnl::engine engine)
      : options_(options),
        max_threads_(options.max_threads > 0 ? options.max_threads
                                             : omp_get_max_threads()),
        isa_(isa),
        lists_(internal::CpuImplementationListsFor(isa)),
        features_{internal::HasNativeBFloat16Products(),
                  internal::HasAmxProducts(), isa == CpuIsa::kAmx},
        primitives_(std::move(engine), options.primitive_cache_capacity) {}

  CpuIsa isa() const { return isa_; }
  bool native_bfloat16() const { return features_.bfloat16_products; }
  const internal::CpuImplementationLists& lists() const { return lists_; }

  // Runs `params` on the first implementation of `list` that takes it, on
  // the threads its work is worth; returns that implementation's name.
  template <typename Params>
  absl::StatusOr<const char*> Run(internal::CpuImplementationList<Params> list,
                                  const Params& params) {
    const int threads = ThreadsFor(EstimatedFlops(params));
    ScopedOmpThreads scoped(threads);
    return internal::RunFirstThatTakes(
        list,
        internal::CpuCall<Params>{params, threads, features_, primitives_},
        options_.skipped_implementations);
  }

 private:
  int ThreadsFor(double flops) const {
    return flops < options_.single_thread_below_flops ? 1 : max_threads_;
  }

  const Options options_;
  const int max_threads_;
  const CpuIsa isa_;
  const internal::CpuImplementationLists& lists_;
  const internal::CpuFeatures features_;
  internal::OneDnnPrimitives primitives_;
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

std::vector<std::string> OneDnnBackend::implementation_names() const {
  return internal::ImplementationNames(impl_->lists());
}

const char* OneDnnBackend::bfloat16_attention() const {
  return impl_->native_bfloat16() ? "native" : "emulated";
}

bool OneDnnBackend::SpreadsKeysAcrossThreads(const AttentionParams& p) const {
  return p.lk >= 2 * kMinKeysPerShare;
}

absl::StatusOr<const char*> OneDnnBackend::MaskedSoftmax(
    const MaskedSoftmaxParams& p) {
  return impl_->Run(impl_->lists().masked_softmax, p);
}

absl::StatusOr<const char*> OneDnnBackend::BatchMatmul(
    const BatchMatmulParams& p) {
  if (p.precision == Precision::kFloat32) {
    return impl_->Run(impl_->lists().batch_matmul, p);
  }
  // 16-bit products: float32 products of the operands rounded.
  std::vector<float> a, b;
  try {
    a = RoundedCopy(p.a, p.n * p.m * p.k, p.precision);
    b = RoundedCopy(p.b, p.n * p.k * p.p, p.precision);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("no memory for 16-bit operands");
  }
  BatchMatmulParams rounded = p;
  rounded.a = a.data();
  rounded.b = b.data();
  return impl_->Run(impl_->lists().batch_matmul, rounded);
}

absl::StatusOr<const char*> OneDnnBackend::ScaledDotProductAttention(
    const AttentionParams& p) {
  if (p.precision != Precision::kFloat16) {
    // float32, and bfloat16, whose operands the implementations round
    // themselves (internal/cpu/attention_blocks.h: native or emulated).
    return impl_->Run(impl_->lists().attention, p);
  }
  // float16: float32 products of the operands rounded.
  std::vector<float> q, k, v;
  try {
    const int64_t bh = p.batch * p.heads;
    q = RoundedCopy(p.q, bh * p.lq * p.d, p.precision);
    k = RoundedCopy(p.k, bh * p.lk * p.d, p.precision);
    v = RoundedCopy(p.v, bh * p.lk * p.dv, p.precision);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("no memory for 16-bit operands");
  }
  AttentionParams rounded = p;
  rounded.q = q.data();
  rounded.k = k.data();
  rounded.v = v.data();
  return impl_->Run(impl_->lists().attention, rounded);
}

absl::StatusOr<const char*> OneDnnBackend::AdditiveAttention(
    const AdditiveAttentionParams& p) {
  return impl_->Run(impl_->lists().additive_attention, p);
}

absl::StatusOr<const char*> OneDnnBackend::NadarayaWatson(
    const NadarayaWatsonParams& p) {
  return impl_->Run(impl_->lists().nadaraya_watson, p);
}

}  // namespace attn
