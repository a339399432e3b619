#include "attn/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attn/internal/cuda/cublas_library.h"
#include "attn/internal/cuda/device_call.h"
#include "attn/internal/cuda/device_pool.h"
#include "attn/internal/cuda/kernels.h"
#include "attn/internal/residency.h"
#include "attn/status_macros.h"

namespace attn {
namespace {

using cuda_internal::AllFitInt;
using cuda_internal::CublasLibrary;
using cuda_internal::CudaStatus;
using cuda_internal::DeviceCall;
using cuda_internal::DevicePool;
using cuda_internal::ElementType;
using cuda_internal::KeyLimits;
using cuda_internal::LengthCount;
using cuda_internal::OperandType;
using cuda_internal::StagingFor;
using cuda_internal::TooLargeForCublas;

// The names of what runs each operation (implementation_names()).
constexpr char kMaskedSoftmax[] = "cuda-masked-softmax";
constexpr char kMatmul[] = "cublas-matmul";
constexpr char kFusedAttention[] = "cuda-fused-attention";
constexpr char kSplitKeys[] = "cuda-split-keys";
constexpr char kDecode[] = "cuda-decode";
constexpr char kUnfusedAttention[] = "cuda-unfused-attention";
constexpr char kAdditive[] = "cuda-additive";
constexpr char kRegression[] = "cuda-regression";

// Held memories' copies: plain cudaMalloc (a memory is large and lives
// long; the call pool's size classes would round it up) and a synchronous
// copy, once per placement.
class HeldMemoryArena final : public internal::DeviceArena {
 public:
  explicit HeldMemoryArena(int ordinal) : ordinal_(ordinal) {}

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"));
    void* block = nullptr;
    const cudaError_t error = cudaMalloc(&block, static_cast<size_t>(bytes));
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", bytes, " bytes: out of memory"));
    }
    RETURN_IF_ERROR(CudaStatus(error, "cudaMalloc"));
    return block;
  }
  void Free(void* device) override {
    cudaSetDevice(ordinal_);
    cudaFree(device);
  }
  absl::Status CopyIn(void* device, const void* host, int64_t bytes) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"));
    return CudaStatus(cudaMemcpy(device, host, static_cast<size_t>(bytes),
                                 cudaMemcpyHostToDevice),
                      "copy a held memory to the device");
  }

 private:
  const int ordinal_;
};

}  // namespace

class CudaBackend::Impl {
 public:
  Impl(const Options& options, std::string description,
       const CublasLibrary* cublas, const cudaDeviceProp& properties)
      : options(options),
        description(std::move(description)),
        device(options.device, options.max_cached_bytes, cublas),
        multiprocessors(properties.multiProcessorCount),
        shared_per_multiprocessor(
            static_cast<int64_t>(properties.sharedMemPerMultiprocessor)),
        held(internal::Residency::Create(
            std::make_unique<HeldMemoryArena>(options.device),
            options.held_memory_bytes > 0
                ? options.held_memory_bytes
                : static_cast<int64_t>(properties.totalGlobalMem / 2),
            options.on_held_memory_event)) {}

  // Whether the fused kernel runs `p` (else the unfused path).
  bool Fuses(const AttentionParams& p) const {
    return options.fused_attention && p.weights == nullptr &&
           p.score == ScoreKind::kDotProduct && p.d == p.dv &&
           cuda_internal::FusedAttentionSupportsHeadDim(p.d);
  }

  // Whether a fused call that splits its keys runs on the decode kernel:
  // few rows, no mask.
  bool Decodes(const AttentionParams& p) const {
    return options.decode_attention &&
           p.valid.kind == ValidLengths::Kind::kNone && !p.causal &&
           cuda_internal::DecodeAttentionTakes(p.lq, p.d);
  }

  // How the fused kernel cuts `args` on this GPU.
  cuda_internal::FusedAttentionPlan Plan(
      const cuda_internal::FusedAttentionArgs& args) const {
    cuda_internal::FusedAttentionPlan plan = cuda_internal::PlanFusedAttention(
        args, multiprocessors, shared_per_multiprocessor);
    if (!options.split_keys) plan.key_splits = 1;
    return plan;
  }

  // The device copy of a held memory's keys and values for one call;
  // UNIMPLEMENTED (the CPU runs the call) when it is refused room.
  absl::StatusOr<internal::Residency::Pin> Hold(const AttentionParams& p) {
    const bool bits = p.k_bfloat16 != nullptr;
    const void* k = bits ? static_cast<const void*>(p.k_bfloat16) : p.k;
    const void* v = bits ? static_cast<const void*>(p.v_bfloat16) : p.v;
    const int64_t element = bits ? 2 : 4;
    std::shared_ptr<void> attachment =
        p.held->Attachment(this, [&]() -> std::shared_ptr<void> {
          return held->NewEntry(p.held->label(),
                                {{k, p.lk * p.d * element},
                                 {v, p.lk * p.dv * element}});
        });
    absl::StatusOr<internal::Residency::Pin> pin = held->Acquire(
        std::static_pointer_cast<internal::Residency::Entry>(attachment));
    if (!pin.ok()) return absl::UnimplementedError(pin.status().message());
    if (pin->host()[0] != k || pin->host()[1] != v) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keys, values: held memory '", p.held->label(),
          "' was first called with other tensors"));
    }
    return pin;
  }

  const Options options;
  const std::string description;
  cuda_internal::Device device;
  const int multiprocessors;
  const int64_t shared_per_multiprocessor;
  const std::shared_ptr<internal::Residency> held;
};

bool CudaBackend::Compiled() { return true; }

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const Options& options) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    // Without libcuda (no NVIDIA driver), the runtime reports an
    // "insufficient driver": say what that means here.
    const bool absent = error == cudaErrorNoDevice ||
                        error == cudaErrorInsufficientDriver;
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda: no usable GPU", absent ? " (no NVIDIA GPU or driver found)" : "",
        ": ", cudaGetErrorString(error)));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda: no GPU with ordinal ", options.device, " (", count,
        " present)"));
  }
  cudaDeviceProp properties;
  error = cudaGetDeviceProperties(&properties, options.device);
  if (error != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda: cannot read the GPU's properties: ", cudaGetErrorString(error)));
  }
  if (properties.major < 8) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cuda: %s has compute capability %d.%d; the kernels need 8.0 or newer",
        properties.name, properties.major, properties.minor));
  }
  const std::string description = absl::StrFormat(
      "cuda: %s, compute %d.%d, %d SMs, %.1f GiB", properties.name,
      properties.major, properties.minor, properties.multiProcessorCount,
      static_cast<double>(properties.totalGlobalMem) / (1 << 30));
  absl::StatusOr<const CublasLibrary*> cublas = cuda_internal::LoadCublas();
  if (!cublas.ok()) return cublas.status();
  auto backend = std::unique_ptr<CudaBackend>(
      new CudaBackend(
          std::make_unique<Impl>(options, description, *cublas, properties)));

  // Prove that this build's kernels run on this device (a binary without
  // code for its architecture fails here, not on the first request).
  const float x[2] = {0.0f, 1.0f};
  float out[2];
  MaskedSoftmaxParams probe;
  probe.x = x;
  probe.out = out;
  probe.batch = probe.rows = 1;
  probe.columns = 2;
  if (absl::Status status = backend->MaskedSoftmax(probe).status();
      !status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        description, ": the kernels do not run: ", status.message()));
  }
  return backend;
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

std::string CudaBackend::description() const { return impl_->description; }

std::vector<std::string> CudaBackend::implementation_names() const {
  return {kMaskedSoftmax,     kMatmul,   kFusedAttention, kSplitKeys,
          kDecode, kUnfusedAttention, kAdditive,       kRegression};
}

bool CudaBackend::SpreadsKeysAcrossThreads(const AttentionParams& p) const {
  if (!impl_->Fuses(p)) return false;
  cuda_internal::FusedAttentionArgs args;
  args.batch = p.batch;
  args.heads = p.heads;
  args.lq = p.lq;
  args.lk = p.lk;
  args.d = p.d;
  args.type = OperandType(p.precision);
  return impl_->Plan(args).key_splits > 1;
}

std::optional<HeldMemoryStats> CudaBackend::held_memory_stats() const {
  return impl_->held->stats();
}

CudaBackend::MemoryStats CudaBackend::memory_stats() const {
  const DevicePool::Stats stats = impl_->device.pool().stats();
  return {stats.bytes_in_use, stats.peak_bytes_in_use, stats.bytes_cached};
}

void CudaBackend::ResetPeakMemory() { impl_->device.pool().ResetPeak(); }

absl::StatusOr<const char*> CudaBackend::MaskedSoftmax(
    const MaskedSoftmaxParams& p) {
  const int64_t count = p.batch * p.rows * p.columns;
  const int64_t lengths = LengthCount(p.valid, p.batch);
  ASSIGN_OR_RETURN(DeviceCall call,
                   DeviceCall::Begin(&impl_->device,
                                     StagingFor({count, count}, lengths)));
  ASSIGN_OR_RETURN(const float* x, call.UploadFloats(p.x, count));
  ASSIGN_OR_RETURN(KeyLimits limits, call.UploadLimits(p.valid, p.batch, false));
  float* out = const_cast<float*>(x);  // in place: x is this call's copy
  RETURN_IF_ERROR(CudaStatus(
      cuda_internal::LaunchMaskedSoftmax(x, out, p.batch, 1, p.rows, p.columns,
                                         limits, call.stream()),
      "masked softmax"));
  RETURN_IF_ERROR(call.Download(p.out, out, count));
  RETURN_IF_ERROR(call.Finish());
  return kMaskedSoftmax;
}

absl::StatusOr<const char*> CudaBackend::BatchMatmul(
    const BatchMatmulParams& p) {
  if (!AllFitInt({p.n, p.m, p.k, p.p})) return TooLargeForCublas();
  const ElementType type = OperandType(p.precision);
  const int64_t a_count = p.n * p.m * p.k, b_count = p.n * p.k * p.p,
                out_count = p.n * p.m * p.p;
  ASSIGN_OR_RETURN(DeviceCall call,
                   DeviceCall::Begin(&impl_->device,
                                     StagingFor({a_count, b_count, out_count})));
  ASSIGN_OR_RETURN(const void* a, call.UploadOperand(p.a, a_count, type));
  ASSIGN_OR_RETURN(const void* b, call.UploadOperand(p.b, b_count, type));
  ASSIGN_OR_RETURN(float* out, call.ScratchFloats(out_count));
  RETURN_IF_ERROR(call.Gemm(type, p.n, p.m, p.k, p.p, 1.0f, a, p.m * p.k, b,
                            p.k * p.p, false, out, p.m * p.p));
  RETURN_IF_ERROR(call.Download(p.out, out, out_count));
  RETURN_IF_ERROR(call.Finish());
  return kMatmul;
}

absl::StatusOr<const char*> CudaBackend::ScaledDotProductAttention(
    const AttentionParams& p) {
  // K and V as bfloat16 bits (a memory stored rounded): precision is then
  // bfloat16, so they are the operands as they are.
  const bool bits = p.k_bfloat16 != nullptr;
  if (p.log_sum_exp != nullptr) {
    return absl::UnimplementedError(
        "cuda: calls that ask for the log-sum-exp run on the CPU");
  }
  const ElementType type = OperandType(p.precision);
  if (p.score == ScoreKind::kGaussian && type != ElementType::kFloat32) {
    return absl::UnimplementedError(
        "cuda: Gaussian scores run in float32 only");
  }
  const int64_t bh = p.batch * p.heads;
  const int64_t q_count = bh * p.lq * p.d, k_count = bh * p.lk * p.d,
                v_count = bh * p.lk * p.dv, out_count = bh * p.lq * p.dv;
  const bool fused = impl_->Fuses(p);
  if (!fused && !AllFitInt({bh, p.lq, p.lk, p.d, p.dv})) {
    return TooLargeForCublas();
  }
  // A held memory's keys and values are on the device already; declared
  // before the call, so the copy stays pinned until its kernels are done.
  std::optional<internal::Residency::Pin> pin;
  if (p.held != nullptr) {
    absl::StatusOr<internal::Residency::Pin> held = impl_->Hold(p);
    if (!held.ok()) return held.status();
    pin.emplace(std::move(held).value());
  }
  const int64_t weight_count = p.weights != nullptr ? bh * p.lq * p.lk : 0;
  ASSIGN_OR_RETURN(
      DeviceCall call,
      DeviceCall::Begin(&impl_->device,
                        StagingFor({q_count, pin ? 0 : k_count,
                                    pin ? 0 : v_count, out_count, weight_count},
                                   LengthCount(p.valid, p.batch))));
  ASSIGN_OR_RETURN(const void* q, call.UploadOperand(p.q, q_count, type));
  const void* k;
  const void* v;
  if (pin) {
    k = pin->device()[0];
    v = pin->device()[1];
    if (!bits && type != ElementType::kFloat32) {
      ASSIGN_OR_RETURN(k, call.Convert(static_cast<const float*>(k), k_count,
                                       type));
      ASSIGN_OR_RETURN(v, call.Convert(static_cast<const float*>(v), v_count,
                                       type));
    }
  } else if (bits) {
    ASSIGN_OR_RETURN(k, call.Upload(p.k_bfloat16, k_count * sizeof(uint16_t)));
    ASSIGN_OR_RETURN(v, call.Upload(p.v_bfloat16, v_count * sizeof(uint16_t)));
  } else {
    ASSIGN_OR_RETURN(k, call.UploadOperand(p.k, k_count, type));
    ASSIGN_OR_RETURN(v, call.UploadOperand(p.v, v_count, type));
  }
  ASSIGN_OR_RETURN(KeyLimits limits,
                   call.UploadLimits(p.valid, p.batch, p.causal));
  ASSIGN_OR_RETURN(float* out, call.ScratchFloats(out_count));

  const char* implementation = fused ? kFusedAttention : kUnfusedAttention;
  if (fused) {
    cuda_internal::AttentionOperands operands;
    operands.q = q;
    operands.k = k;
    operands.v = v;
    operands.out = out;
    operands.batch = p.batch;
    operands.heads = p.heads;
    operands.lq = p.lq;
    operands.lk = p.lk;
    operands.d = p.d;
    operands.scale = p.scale;
    operands.type = type;
    cuda_internal::FusedAttentionArgs args;
    static_cast<cuda_internal::AttentionOperands&>(args) = operands;
    args.limits = limits;
    const cuda_internal::FusedAttentionPlan plan = impl_->Plan(args);
    args.block_rows = plan.block_rows;
    if (plan.key_splits > 1 && impl_->Decodes(p)) {
      // Few unmasked rows: the keys streamed once on the CUDA cores.
      implementation = kDecode;
      cuda_internal::DecodeAttentionArgs decode;
      static_cast<cuda_internal::AttentionOperands&>(decode) = operands;
      decode.keys_per_split =
          cuda_internal::PlanDecodeAttention(decode, impl_->multiprocessors);
      const int64_t splits =
          (p.lk + decode.keys_per_split - 1) / decode.keys_per_split;
      ASSIGN_OR_RETURN(decode.partial_out,
                       call.ScratchFloats(splits * bh * p.lq * p.d));
      ASSIGN_OR_RETURN(decode.partial_stats,
                       call.ScratchFloats(splits * bh * p.lq * 2));
      RETURN_IF_ERROR(CudaStatus(
          cuda_internal::LaunchDecodeAttention(decode, call.stream()),
          "decode attention"));
    } else {
      if (plan.key_splits > 1) {
        implementation = kSplitKeys;
        args.key_splits = plan.key_splits;
        args.tiles_per_split = plan.tiles_per_split;
        ASSIGN_OR_RETURN(args.partial_out,
                         call.ScratchFloats(plan.key_splits * bh * p.lq * p.d));
        ASSIGN_OR_RETURN(args.partial_stats,
                         call.ScratchFloats(plan.key_splits * bh * p.lq * 2));
      }
      RETURN_IF_ERROR(CudaStatus(
          cuda_internal::LaunchFusedAttention(args, call.stream()),
          "fused attention"));
    }
  } else {
    ASSIGN_OR_RETURN(float* scores, call.ScratchFloats(bh * p.lq * p.lk));
    if (p.score == ScoreKind::kGaussian) {
      RETURN_IF_ERROR(CudaStatus(
          cuda_internal::LaunchGaussianScores(
              static_cast<const float*>(q), static_cast<const float*>(k),
              scores, bh, p.lq, p.lk, p.d, p.scale, call.stream()),
          "Gaussian scores"));
    } else {
      RETURN_IF_ERROR(call.Gemm(type, bh, p.lq, p.d, p.lk, p.scale, q,
                                p.lq * p.d, k, p.lk * p.d, true, scores,
                                p.lq * p.lk));
    }
    RETURN_IF_ERROR(CudaStatus(
        cuda_internal::LaunchMaskedSoftmax(scores, scores, p.batch, p.heads,
                                           p.lq, p.lk, limits, call.stream()),
        "masked softmax"));
    const void* probabilities = scores;
    if (type != ElementType::kFloat32) {
      ASSIGN_OR_RETURN(probabilities,
                       call.Convert(scores, bh * p.lq * p.lk, type));
    }
    RETURN_IF_ERROR(call.Gemm(type, bh, p.lq, p.lk, p.dv, 1.0f, probabilities,
                              p.lq * p.lk, v, p.lk * p.dv, false, out,
                              p.lq * p.dv));
    if (p.weights != nullptr) {
      RETURN_IF_ERROR(call.Download(p.weights, scores, weight_count));
    }
  }
  RETURN_IF_ERROR(call.Download(p.out, out, out_count));
  RETURN_IF_ERROR(call.Finish());
  return implementation;
}

absl::StatusOr<const char*> CudaBackend::AdditiveAttention(
    const AdditiveAttentionParams& p) {
  if (!AllFitInt({p.batch * p.lq, p.batch * p.lk, p.lq, p.lk, p.dq, p.dk,
                  p.h, p.dv})) {
    return TooLargeForCublas();
  }
  const int64_t q_count = p.batch * p.lq * p.dq, k_count = p.batch * p.lk * p.dk,
                v_count = p.batch * p.lk * p.dv, out_count = p.batch * p.lq * p.dv,
                weight_count = p.weights != nullptr ? p.batch * p.lq * p.lk : 0;
  ASSIGN_OR_RETURN(
      DeviceCall call,
      DeviceCall::Begin(&impl_->device,
                        StagingFor({q_count, k_count, v_count, p.h * p.dq,
                                    p.h * p.dk, p.h, out_count, weight_count},
                                   LengthCount(p.valid, p.batch))));
  ASSIGN_OR_RETURN(const float* q, call.UploadFloats(p.q, q_count));
  ASSIGN_OR_RETURN(const float* k, call.UploadFloats(p.k, k_count));
  ASSIGN_OR_RETURN(const float* v, call.UploadFloats(p.v, v_count));
  ASSIGN_OR_RETURN(const float* w_q, call.UploadFloats(p.w_q, p.h * p.dq));
  ASSIGN_OR_RETURN(const float* w_k, call.UploadFloats(p.w_k, p.h * p.dk));
  ASSIGN_OR_RETURN(const float* w_v, call.UploadFloats(p.w_v, p.h));
  ASSIGN_OR_RETURN(KeyLimits limits, call.UploadLimits(p.valid, p.batch, false));

  // Projections: qp (batch * lq, h) = q w_q^T, kp (batch * lk, h) = k w_k^T.
  ASSIGN_OR_RETURN(float* qp, call.ScratchFloats(p.batch * p.lq * p.h));
  ASSIGN_OR_RETURN(float* kp, call.ScratchFloats(p.batch * p.lk * p.h));
  RETURN_IF_ERROR(call.Gemm(ElementType::kFloat32, 1, p.batch * p.lq, p.dq,
                            p.h, 1.0f, q, 0, w_q, 0, true, qp, 0));
  RETURN_IF_ERROR(call.Gemm(ElementType::kFloat32, 1, p.batch * p.lk, p.dk,
                            p.h, 1.0f, k, 0, w_k, 0, true, kp, 0));
  ASSIGN_OR_RETURN(float* scores, call.ScratchFloats(p.batch * p.lq * p.lk));
  RETURN_IF_ERROR(CudaStatus(
      cuda_internal::LaunchAdditiveScores(qp, kp, w_v, scores, p.batch, p.lq,
                                          p.lk, p.h, call.stream()),
      "additive scores"));
  RETURN_IF_ERROR(CudaStatus(
      cuda_internal::LaunchMaskedSoftmax(scores, scores, p.batch, 1, p.lq,
                                         p.lk, limits, call.stream()),
      "masked softmax"));
  ASSIGN_OR_RETURN(float* out, call.ScratchFloats(out_count));
  RETURN_IF_ERROR(call.Gemm(ElementType::kFloat32, p.batch, p.lq, p.lk, p.dv,
                            1.0f, scores, p.lq * p.lk, v, p.lk * p.dv, false,
                            out, p.lq * p.dv));
  if (p.weights != nullptr) {
    RETURN_IF_ERROR(call.Download(p.weights, scores, weight_count));
  }
  RETURN_IF_ERROR(call.Download(p.out, out, out_count));
  RETURN_IF_ERROR(call.Finish());
  return kAdditive;
}

absl::StatusOr<const char*> CudaBackend::NadarayaWatson(
    const NadarayaWatsonParams& p) {
  if (!AllFitInt({p.n_query, p.n_train, p.dx, p.dy})) return TooLargeForCublas();
  const int64_t weight_count = p.n_query * p.n_train;
  const int64_t out_count = p.n_query * p.dy;
  ASSIGN_OR_RETURN(
      DeviceCall call,
      DeviceCall::Begin(&impl_->device,
                        StagingFor({p.n_train * p.dx, p.n_train * p.dy,
                                    p.n_query * p.dx, out_count,
                                    p.weights != nullptr ? weight_count : 0})));
  ASSIGN_OR_RETURN(const float* x_train,
                   call.UploadFloats(p.x_train, p.n_train * p.dx));
  ASSIGN_OR_RETURN(const float* y_train,
                   call.UploadFloats(p.y_train, p.n_train * p.dy));
  ASSIGN_OR_RETURN(const float* x_query,
                   call.UploadFloats(p.x_query, p.n_query * p.dx));
  ASSIGN_OR_RETURN(float* weights, call.ScratchFloats(weight_count));
  RETURN_IF_ERROR(CudaStatus(
      cuda_internal::LaunchRegressionScores(
          x_query, x_train, weights, p.n_query, p.n_train, p.dx,
          static_cast<int>(p.kernel), p.bandwidth, call.stream()),
      "regression scores"));
  if (p.kernel == RegressionKernel::kGaussian) {
    // Normalising exp(-u^2/2) as a softmax keeps far queries from
    // underflowing to zero mass.
    RETURN_IF_ERROR(CudaStatus(
        cuda_internal::LaunchMaskedSoftmax(weights, weights, 1, 1, p.n_query,
                                           p.n_train, KeyLimits{},
                                           call.stream()),
        "masked softmax"));
  } else {
    RETURN_IF_ERROR(CudaStatus(
        cuda_internal::LaunchNormalizeRows(weights, p.n_query, p.n_train,
                                           call.stream()),
        "normalize rows"));
  }
  ASSIGN_OR_RETURN(float* out, call.ScratchFloats(out_count));
  RETURN_IF_ERROR(call.Gemm(ElementType::kFloat32, 1, p.n_query, p.n_train,
                            p.dy, 1.0f, weights, 0, y_train, 0, false, out, 0));
  if (p.weights != nullptr) {
    RETURN_IF_ERROR(call.Download(p.weights, weights, weight_count));
  }
  RETURN_IF_ERROR(call.Download(p.out, out, out_count));
  RETURN_IF_ERROR(call.Finish());
  return kRegression;
}

}  // namespace attn
