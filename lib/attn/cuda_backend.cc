#include "attn/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "attn/internal/cuda/cublas_library.h"
#include "attn/internal/cuda/device_pool.h"
#include "attn/internal/cuda/kernels.h"
#include "attn/status_macros.h"

namespace attn {
namespace {

using cuda_internal::CublasLibrary;
using cuda_internal::DeviceBuffer;
using cuda_internal::DevicePool;
using cuda_internal::ElementType;
using cuda_internal::KeyLimits;

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(error)));
  }
  if (error == cudaErrorInvalidConfiguration) {
    // Our launchers' answer for a grid CUDA cannot express: a shape for
    // another backend, reported before any output is written.
    cudaGetLastError();
    return absl::UnimplementedError(
        absl::StrCat("cuda: ", what, ": the shape exceeds the launch limits"));
  }
  return absl::InternalError(
      absl::StrCat("cuda: ", what, ": ", cudaGetErrorString(error)));
}

absl::Status CublasStatus(const CublasLibrary& cublas, cublasStatus_t status,
                          const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cublas: ", what, ": allocation failed"));
  }
  return absl::InternalError(absl::StrCat("cublas: ", what, ": ",
                                          cublas.get_status_string(status)));
}

bool FitsInt(int64_t value) {
  return value <= std::numeric_limits<int>::max();
}

ElementType OperandType(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16:
      return ElementType::kBFloat16;
    case Precision::kFloat16:
      return ElementType::kFloat16;
    case Precision::kFloat32:
      break;
  }
  return ElementType::kFloat32;
}

cudaDataType_t CudaType(ElementType type) {
  switch (type) {
    case ElementType::kBFloat16:
      return CUDA_R_16BF;
    case ElementType::kFloat16:
      return CUDA_R_16F;
    case ElementType::kFloat32:
      break;
  }
  return CUDA_R_32F;
}

size_t ElementBytes(ElementType type) {
  return type == ElementType::kFloat32 ? 4 : 2;
}

KeyLimits::Kind LimitKind(ValidLengths::Kind kind) {
  switch (kind) {
    case ValidLengths::Kind::kPerBatch:
      return KeyLimits::kPerBatch;
    case ValidLengths::Kind::kPerRow:
      return KeyLimits::kPerRow;
    case ValidLengths::Kind::kNone:
      break;
  }
  return KeyLimits::kNone;
}

int64_t LengthCount(const ValidLengths& valid, int64_t batch) {
  switch (valid.kind) {
    case ValidLengths::Kind::kPerBatch:
      return batch;
    case ValidLengths::Kind::kPerRow:
      return batch * valid.rows;
    case ValidLengths::Kind::kNone:
      break;
  }
  return 0;
}

constexpr size_t kStagingAlignment = 256;
size_t Aligned(size_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment *
         kStagingAlignment;
}

// Pinned host memory, grown on demand (never shrunk) and reused by the calls
// of one context.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }

  absl::Status Reserve(size_t bytes) {
    if (bytes <= size_) return absl::OkStatus();
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
    void* data = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&data, bytes, cudaHostAllocDefault),
                               "cudaHostAlloc (pinned staging)"));
    data_ = static_cast<unsigned char*>(data);
    size_ = bytes;
    return absl::OkStatus();
  }
  unsigned char* data() const { return data_; }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// What one calling thread uses at a time.
struct Context {
  explicit Context(const CublasLibrary* library) : cublas_library(library) {}
  ~Context() {
    if (cublas != nullptr) cublas_library->destroy(cublas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  const CublasLibrary* const cublas_library;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  PinnedBuffer staging;
};

absl::StatusOr<std::unique_ptr<Context>> NewContext(
    int device, const CublasLibrary* cublas) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  auto context = std::make_unique<Context>(cublas);
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&context->stream, cudaStreamNonBlocking),
      "cudaStreamCreate"));
  RETURN_IF_ERROR(CublasStatus(*cublas, cublas->create(&context->cublas),
                               "cublasCreate"));
  RETURN_IF_ERROR(CublasStatus(
      *cublas, cublas->set_stream(context->cublas, context->stream),
      "cublasSetStream"));
  // Float32 products stay float32: no TF32 unless a precision asks for less.
  RETURN_IF_ERROR(CublasStatus(
      *cublas, cublas->set_math_mode(context->cublas, CUBLAS_PEDANTIC_MATH),
      "cublasSetMathMode"));
  return context;
}

}  // namespace

class CudaBackend::Impl {
 public:
  Impl(const Options& options, std::string description,
       const CublasLibrary* cublas)
      : options_(options),
        description_(std::move(description)),
        cublas_(cublas),
        pool_(options.max_cached_bytes) {}

  ~Impl() {
    absl::MutexLock lock(&mutex_);
    idle_contexts_.clear();
  }

  const Options& options() const { return options_; }
  const CublasLibrary& cublas() const { return *cublas_; }
  const std::string& description() const { return description_; }
  DevicePool& pool() { return pool_; }

  // Lends a context to one call (creating one when all are busy); the call
  // gives it back with Return.
  absl::StatusOr<std::unique_ptr<Context>> Borrow() {
    {
      absl::MutexLock lock(&mutex_);
      if (!idle_contexts_.empty()) {
        std::unique_ptr<Context> context = std::move(idle_contexts_.back());
        idle_contexts_.pop_back();
        return context;
      }
    }
    return NewContext(options_.device, cublas_);
  }
  void Return(std::unique_ptr<Context> context) {
    absl::MutexLock lock(&mutex_);
    idle_contexts_.push_back(std::move(context));
  }

 private:
  const Options options_;
  const std::string description_;
  const CublasLibrary* const cublas_;
  DevicePool pool_;
  absl::Mutex mutex_;
  std::vector<std::unique_ptr<Context>> idle_contexts_ ABSL_GUARDED_BY(mutex_);
};

namespace {

// One operation's use of the device: a borrowed context, the pool buffers it
// allocates, and the outputs to copy back. Every method enqueues on the
// context's stream; Finish waits and copies the outputs out. The destructor
// waits for the stream too (even after an error), so no buffer returns to
// the pool while a kernel may still use it.
class DeviceCall {
 public:
  static absl::StatusOr<DeviceCall> Begin(CudaBackend::Impl* impl,
                                          size_t staging_bytes) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(impl->options().device),
                               "cudaSetDevice"));
    ASSIGN_OR_RETURN(std::unique_ptr<Context> context, impl->Borrow());
    absl::Status reserved = context->staging.Reserve(staging_bytes);
    if (!reserved.ok()) {
      impl->Return(std::move(context));
      return reserved;
    }
    return DeviceCall(impl, std::move(context));
  }

  DeviceCall(DeviceCall&& other) noexcept
      : impl_(other.impl_),
        context_(std::move(other.context_)),
        buffers_(std::move(other.buffers_)),
        downloads_(std::move(other.downloads_)),
        staged_(other.staged_) {}
  DeviceCall& operator=(DeviceCall&&) = delete;

  ~DeviceCall() {
    if (context_ == nullptr) return;
    cudaStreamSynchronize(context_->stream);
    buffers_.clear();
    impl_->Return(std::move(context_));
  }

  cudaStream_t stream() const { return context_->stream; }

  // Uninitialised device memory for `count` elements of `bytes_each`.
  absl::StatusOr<void*> Scratch(int64_t count, size_t bytes_each) {
    ASSIGN_OR_RETURN(DeviceBuffer buffer,
                     impl_->pool().Allocate(static_cast<size_t>(count) * bytes_each));
    buffers_.push_back(std::move(buffer));
    return buffers_.back().data();
  }
  absl::StatusOr<float*> ScratchFloats(int64_t count) {
    ASSIGN_OR_RETURN(void* data, Scratch(count, sizeof(float)));
    return static_cast<float*>(data);
  }

  // Copies `bytes` from the host into new device memory: host -> staging
  // (synchronously) then staging -> device (queued at once, so it overlaps
  // the staging of the next input).
  absl::StatusOr<void*> Upload(const void* host, size_t bytes) {
    ASSIGN_OR_RETURN(void* device, Scratch(static_cast<int64_t>(bytes), 1));
    unsigned char* staged = context_->staging.data() + staged_;
    std::memcpy(staged, host, bytes);
    staged_ += Aligned(bytes);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(device, staged, bytes, cudaMemcpyHostToDevice,
                        context_->stream),
        "cudaMemcpyAsync (to device)"));
    return device;
  }
  absl::StatusOr<const float*> UploadFloats(const float* host, int64_t count) {
    ASSIGN_OR_RETURN(void* device,
                     Upload(host, static_cast<size_t>(count) * sizeof(float)));
    return static_cast<const float*>(device);
  }

  // The device copy of `data` (float32) as operands of `type`: the upload
  // itself for float32, else a rounded copy.
  absl::StatusOr<const void*> UploadOperand(const float* host, int64_t count,
                                            ElementType type) {
    ASSIGN_OR_RETURN(const float* device, UploadFloats(host, count));
    if (type == ElementType::kFloat32) return device;
    return Convert(device, count, type);
  }
  absl::StatusOr<const void*> Convert(const float* device, int64_t count,
                                      ElementType type) {
    ASSIGN_OR_RETURN(void* converted, Scratch(count, ElementBytes(type)));
    RETURN_IF_ERROR(CudaStatus(
        cuda_internal::LaunchConvert(device, converted, count, type, stream()),
        "convert operands"));
    return converted;
  }

  absl::StatusOr<KeyLimits> UploadLimits(const ValidLengths& valid,
                                         int64_t batch, bool causal) {
    KeyLimits limits;
    limits.kind = LimitKind(valid.kind);
    limits.causal = causal;
    const int64_t count = LengthCount(valid, batch);
    if (count > 0) {
      ASSIGN_OR_RETURN(void* device,
                       Upload(valid.data, static_cast<size_t>(count) * sizeof(int32_t)));
      limits.valid = static_cast<const int32_t*>(device);
    }
    return limits;
  }

  // Queues device -> staging; Finish copies staging -> `host`.
  absl::Status Download(float* host, const float* device, int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    unsigned char* staged = context_->staging.data() + staged_;
    staged_ += Aligned(bytes);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(staged, device, bytes, cudaMemcpyDeviceToHost,
                        context_->stream),
        "cudaMemcpyAsync (to host)"));
    downloads_.push_back({host, staged, bytes});
    return absl::OkStatus();
  }

  absl::Status Finish() {
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(context_->stream), "the kernels"));
    for (const PendingDownload& download : downloads_) {
      std::memcpy(download.host, download.staged, download.bytes);
    }
    return absl::OkStatus();
  }

  // Row-major C (n, m, p) = alpha * A (n, m, k) x B, where B is (n, k, p),
  // or (n, p, k) used transposed when b_transposed; stride 0 broadcasts an
  // operand over the batch. Operands of `type`, C float32.
  absl::Status Gemm(ElementType type, int64_t n, int64_t m, int64_t k,
                    int64_t p, float alpha, const void* a, int64_t stride_a,
                    const void* b, int64_t stride_b, bool b_transposed,
                    float* c, int64_t stride_c) {
    // cuBLAS is column-major: C^T (p x m) = B^T (p x k) * A^T (k x m).
    const float beta = 0.0f;
    const cudaDataType_t ab_type = CudaType(type);
    return CublasStatus(
        impl_->cublas(),
        impl_->cublas().gemm_strided_batched_ex(
            context_->cublas, b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
            CUBLAS_OP_N, static_cast<int>(p), static_cast<int>(m),
            static_cast<int>(k), &alpha, b, ab_type,
            static_cast<int>(b_transposed ? k : p), stride_b, a, ab_type,
            static_cast<int>(k), stride_a, &beta, c, CUDA_R_32F,
            static_cast<int>(p), stride_c, static_cast<int>(n),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  }

 private:
  struct PendingDownload {
    float* host;
    const unsigned char* staged;
    size_t bytes;
  };

  DeviceCall(CudaBackend::Impl* impl, std::unique_ptr<Context> context)
      : impl_(impl), context_(std::move(context)) {}

  CudaBackend::Impl* impl_;
  std::unique_ptr<Context> context_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<PendingDownload> downloads_;
  size_t staged_ = 0;
};

// Staging bytes for float32 tensors of these element counts.
size_t StagingFor(std::initializer_list<int64_t> float_counts,
                  int64_t length_count = 0) {
  size_t bytes = Aligned(static_cast<size_t>(length_count) * sizeof(int32_t));
  for (int64_t count : float_counts) {
    bytes += Aligned(static_cast<size_t>(count) * sizeof(float));
  }
  return bytes;
}

bool AllFitInt(std::initializer_list<int64_t> values) {
  for (int64_t value : values) {
    if (!FitsInt(value)) return false;
  }
  return true;
}

absl::Status TooLargeForCublas() {
  return absl::UnimplementedError(
      "cuda: a matrix dimension exceeds cuBLAS's int range");
}

}  // namespace

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
      new CudaBackend(std::make_unique<Impl>(options, description, *cublas)));

  // Prove that this build's kernels run on this device (a binary without
  // code for its architecture fails here, not on the first request).
  const float x[2] = {0.0f, 1.0f};
  float out[2];
  MaskedSoftmaxParams probe;
  probe.x = x;
  probe.out = out;
  probe.batch = probe.rows = 1;
  probe.columns = 2;
  if (absl::Status status = backend->MaskedSoftmax(probe); !status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        description, ": the kernels do not run: ", status.message()));
  }
  return backend;
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

std::string CudaBackend::description() const { return impl_->description(); }

CudaBackend::MemoryStats CudaBackend::memory_stats() const {
  const DevicePool::Stats stats = impl_->pool().stats();
  return {stats.bytes_in_use, stats.peak_bytes_in_use, stats.bytes_cached};
}

void CudaBackend::ResetPeakMemory() { impl_->pool().ResetPeak(); }

absl::Status CudaBackend::MaskedSoftmax(const MaskedSoftmaxParams& p) {
  const int64_t count = p.batch * p.rows * p.columns;
  const int64_t lengths = LengthCount(p.valid, p.batch);
  ASSIGN_OR_RETURN(DeviceCall call,
                   DeviceCall::Begin(impl_.get(), StagingFor({count, count}, lengths)));
  ASSIGN_OR_RETURN(const float* x, call.UploadFloats(p.x, count));
  ASSIGN_OR_RETURN(KeyLimits limits, call.UploadLimits(p.valid, p.batch, false));
  float* out = const_cast<float*>(x);  // in place: x is this call's copy
  RETURN_IF_ERROR(CudaStatus(
      cuda_internal::LaunchMaskedSoftmax(x, out, p.batch, 1, p.rows, p.columns,
                                         limits, call.stream()),
      "masked softmax"));
  RETURN_IF_ERROR(call.Download(p.out, out, count));
  return call.Finish();
}

absl::Status CudaBackend::BatchMatmul(const BatchMatmulParams& p) {
  if (!AllFitInt({p.n, p.m, p.k, p.p})) return TooLargeForCublas();
  const ElementType type = OperandType(p.precision);
  const int64_t a_count = p.n * p.m * p.k, b_count = p.n * p.k * p.p,
                out_count = p.n * p.m * p.p;
  ASSIGN_OR_RETURN(DeviceCall call,
                   DeviceCall::Begin(impl_.get(),
                                     StagingFor({a_count, b_count, out_count})));
  ASSIGN_OR_RETURN(const void* a, call.UploadOperand(p.a, a_count, type));
  ASSIGN_OR_RETURN(const void* b, call.UploadOperand(p.b, b_count, type));
  ASSIGN_OR_RETURN(float* out, call.ScratchFloats(out_count));
  RETURN_IF_ERROR(call.Gemm(type, p.n, p.m, p.k, p.p, 1.0f, a, p.m * p.k, b,
                            p.k * p.p, false, out, p.m * p.p));
  RETURN_IF_ERROR(call.Download(p.out, out, out_count));
  return call.Finish();
}

absl::Status CudaBackend::ScaledDotProductAttention(const AttentionParams& p) {
  if (p.k_bfloat16 != nullptr) {
    return absl::UnimplementedError(
        "cuda: keys and values held as bfloat16 run on the CPU");
  }
  const ElementType type = OperandType(p.precision);
  if (p.score == ScoreKind::kGaussian && type != ElementType::kFloat32) {
    return absl::UnimplementedError(
        "cuda: Gaussian scores run in float32 only");
  }
  const int64_t bh = p.batch * p.heads;
  const int64_t q_count = bh * p.lq * p.d, k_count = bh * p.lk * p.d,
                v_count = bh * p.lk * p.dv, out_count = bh * p.lq * p.dv;
  const bool fused = impl_->options().fused_attention &&
                     p.weights == nullptr && p.score == ScoreKind::kDotProduct &&
                     p.d == p.dv &&
                     cuda_internal::FusedAttentionSupportsHeadDim(p.d);
  if (!fused && !AllFitInt({bh, p.lq, p.lk, p.d, p.dv})) {
    return TooLargeForCublas();
  }
  const int64_t weight_count = p.weights != nullptr ? bh * p.lq * p.lk : 0;
  ASSIGN_OR_RETURN(
      DeviceCall call,
      DeviceCall::Begin(impl_.get(),
                        StagingFor({q_count, k_count, v_count, out_count,
                                    weight_count},
                                   LengthCount(p.valid, p.batch))));
  ASSIGN_OR_RETURN(const void* q, call.UploadOperand(p.q, q_count, type));
  ASSIGN_OR_RETURN(const void* k, call.UploadOperand(p.k, k_count, type));
  ASSIGN_OR_RETURN(const void* v, call.UploadOperand(p.v, v_count, type));
  ASSIGN_OR_RETURN(KeyLimits limits,
                   call.UploadLimits(p.valid, p.batch, p.causal));
  ASSIGN_OR_RETURN(float* out, call.ScratchFloats(out_count));

  if (fused) {
    cuda_internal::FusedAttentionArgs args;
    args.q = q;
    args.k = k;
    args.v = v;
    args.out = out;
    args.batch = p.batch;
    args.heads = p.heads;
    args.lq = p.lq;
    args.lk = p.lk;
    args.d = p.d;
    args.scale = p.scale;
    args.limits = limits;
    args.type = type;
    RETURN_IF_ERROR(CudaStatus(
        cuda_internal::LaunchFusedAttention(args, call.stream()),
        "fused attention"));
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
  return call.Finish();
}

absl::Status CudaBackend::AdditiveAttention(const AdditiveAttentionParams& p) {
  if (!AllFitInt({p.batch * p.lq, p.batch * p.lk, p.lq, p.lk, p.dq, p.dk,
                  p.h, p.dv})) {
    return TooLargeForCublas();
  }
  const int64_t q_count = p.batch * p.lq * p.dq, k_count = p.batch * p.lk * p.dk,
                v_count = p.batch * p.lk * p.dv, out_count = p.batch * p.lq * p.dv,
                weight_count = p.weights != nullptr ? p.batch * p.lq * p.lk : 0;
  ASSIGN_OR_RETURN(
      DeviceCall call,
      DeviceCall::Begin(impl_.get(),
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
  return call.Finish();
}

absl::Status CudaBackend::NadarayaWatson(const NadarayaWatsonParams& p) {
  if (!AllFitInt({p.n_query, p.n_train, p.dx, p.dy})) return TooLargeForCublas();
  const int64_t weight_count = p.n_query * p.n_train;
  const int64_t out_count = p.n_query * p.dy;
  ASSIGN_OR_RETURN(
      DeviceCall call,
      DeviceCall::Begin(impl_.get(),
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
  return call.Finish();
}

}  // namespace attn
