#include "attn/internal/cuda/device_call.h"

#include <library_types.h>

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attn::cuda_internal {
namespace {

bool FitsInt(int64_t value) {
  return value <= std::numeric_limits<int>::max();
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

constexpr size_t kStagingAlignment = 256;
size_t Aligned(size_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment *
         kStagingAlignment;
}

}  // namespace


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

size_t StagingFor(std::initializer_list<int64_t> float_counts,
                  int64_t length_count) {
  size_t bytes = Aligned(static_cast<size_t>(length_count) * sizeof(int32_t));
  for (int64_t count : float_counts) {
    bytes += Aligned(static_cast<size_t>(count) * sizeof(float));
  }
  return bytes;
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

namespace {

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

Device::Device(int ordinal, int64_t max_cached_bytes,
               const CublasLibrary* cublas)
    : ordinal_(ordinal), cublas_(cublas), pool_(max_cached_bytes) {}

Device::~Device() {
  absl::MutexLock lock(&mutex_);
  idle_contexts_.clear();
}

absl::StatusOr<std::unique_ptr<Context>> Device::Borrow() {
  {
    absl::MutexLock lock(&mutex_);
    if (!idle_contexts_.empty()) {
      std::unique_ptr<Context> context = std::move(idle_contexts_.back());
      idle_contexts_.pop_back();
      return context;
    }
  }
  return NewContext(ordinal_, cublas_);
}

void Device::Return(std::unique_ptr<Context> context) {
  absl::MutexLock lock(&mutex_);
  idle_contexts_.push_back(std::move(context));
}

absl::StatusOr<DeviceCall> DeviceCall::Begin(Device* device,
                                             size_t staging_bytes) {
  RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device->ordinal()), "cudaSetDevice"));
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, device->Borrow());
  absl::Status reserved = context->staging.Reserve(staging_bytes);
  if (!reserved.ok()) {
    device->Return(std::move(context));
    return reserved;
  }
  return DeviceCall(device, std::move(context));
}

DeviceCall::DeviceCall(Device* device, std::unique_ptr<Context> context)
    : device_(device), context_(std::move(context)) {}

DeviceCall::DeviceCall(DeviceCall&& other) noexcept
    : device_(other.device_),
      context_(std::move(other.context_)),
      buffers_(std::move(other.buffers_)),
      downloads_(std::move(other.downloads_)),
      staged_(other.staged_) {}

DeviceCall::~DeviceCall() {
  if (context_ == nullptr) return;
  cudaStreamSynchronize(context_->stream);
  buffers_.clear();
  device_->Return(std::move(context_));
}

cudaStream_t DeviceCall::stream() const { return context_->stream; }

absl::StatusOr<void*> DeviceCall::Scratch(int64_t count, size_t bytes_each) {
  ASSIGN_OR_RETURN(DeviceBuffer buffer,
                   device_->pool().Allocate(static_cast<size_t>(count) *
                                            bytes_each));
  buffers_.push_back(std::move(buffer));
  return buffers_.back().data();
}

absl::StatusOr<float*> DeviceCall::ScratchFloats(int64_t count) {
  ASSIGN_OR_RETURN(void* data, Scratch(count, sizeof(float)));
  return static_cast<float*>(data);
}

absl::StatusOr<void*> DeviceCall::Upload(const void* host, size_t bytes) {
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

absl::StatusOr<const float*> DeviceCall::UploadFloats(const float* host,
                                                      int64_t count) {
  ASSIGN_OR_RETURN(void* device,
                   Upload(host, static_cast<size_t>(count) * sizeof(float)));
  return static_cast<const float*>(device);
}

absl::StatusOr<const void*> DeviceCall::UploadOperand(const float* host,
                                                      int64_t count,
                                                      ElementType type) {
  ASSIGN_OR_RETURN(const float* device, UploadFloats(host, count));
  if (type == ElementType::kFloat32) return device;
  return Convert(device, count, type);
}

absl::StatusOr<const void*> DeviceCall::Convert(const float* device,
                                                int64_t count,
                                                ElementType type) {
  ASSIGN_OR_RETURN(void* converted, Scratch(count, ElementBytes(type)));
  RETURN_IF_ERROR(CudaStatus(
      LaunchConvert(device, converted, count, type, stream()),
      "convert operands"));
  return converted;
}

absl::StatusOr<KeyLimits> DeviceCall::UploadLimits(const ValidLengths& valid,
                                                   int64_t batch,
                                                   bool causal) {
  KeyLimits limits;
  limits.kind = LimitKind(valid.kind);
  limits.causal = causal;
  const int64_t count = LengthCount(valid, batch);
  if (count > 0) {
    ASSIGN_OR_RETURN(void* device,
                     Upload(valid.data,
                            static_cast<size_t>(count) * sizeof(int32_t)));
    limits.valid = static_cast<const int32_t*>(device);
  }
  return limits;
}

absl::Status DeviceCall::Download(float* host, const float* device,
                                  int64_t count) {
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

absl::Status DeviceCall::Finish() {
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(context_->stream), "the kernels"));
  for (const PendingDownload& download : downloads_) {
    std::memcpy(download.host, download.staged, download.bytes);
  }
  return absl::OkStatus();
}

absl::Status DeviceCall::Gemm(ElementType type, int64_t n, int64_t m,
                              int64_t k, int64_t p, float alpha, const void* a,
                              int64_t stride_a, const void* b,
                              int64_t stride_b, bool b_transposed, float* c,
                              int64_t stride_c) {
  // cuBLAS is column-major: C^T (p x m) = B^T (p x k) * A^T (k x m).
  const float beta = 0.0f;
  const cudaDataType_t ab_type = CudaType(type);
  const CublasLibrary& cublas = device_->cublas();
  return CublasStatus(
      cublas,
      cublas.gemm_strided_batched_ex(
          context_->cublas, b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
          CUBLAS_OP_N, static_cast<int>(p), static_cast<int>(m),
          static_cast<int>(k), &alpha, b, ab_type,
          static_cast<int>(b_transposed ? k : p), stride_b, a, ab_type,
          static_cast<int>(k), stride_a, &beta, c, CUDA_R_32F,
          static_cast<int>(p), stride_c, static_cast<int>(n),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

}  // namespace attn::cuda_internal
