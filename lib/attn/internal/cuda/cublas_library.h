// cuBLAS, loaded with dlopen when the CUDA backend is created rather than
// linked at start-up.
//
// Why: libcublasLt carries ~92 KiB of thread-local storage. Linked into the
// executable, that joins every thread's static TLS block, and threads
// created with a small fixed stack (civetweb's, behind prometheus-cpp's
// metrics endpoint, ask for 100 KiB) then fail to start. Loaded with dlopen,
// its TLS is allocated lazily, only in threads that use it. It also means a
// machine without the CUDA libraries runs the same binary on the CPU.
#ifndef ATTN_INTERNAL_CUDA_CUBLAS_LIBRARY_H_
#define ATTN_INTERNAL_CUDA_CUBLAS_LIBRARY_H_

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace attn::cuda_internal {

// The cuBLAS entry points the backend uses.
struct CublasLibrary {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*gemm_strided_batched_ex)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
      const void*, const void*, cudaDataType, int, long long int,
      const void*, cudaDataType, int, long long int, const void*, void*,
      cudaDataType, int, long long int, int, cublasComputeType_t,
      cublasGemmAlgo_t);
  const char* (*get_status_string)(cublasStatus_t);
};

// Loads libcublas.so.<major of the headers> once per process (from the
// loader's search path, then the toolkit's library folder of the build) and
// returns its entry points. Thread-safe. FAILED_PRECONDITION, naming the
// library and dlerror's reason, when it cannot be loaded.
absl::StatusOr<const CublasLibrary*> LoadCublas();

}  // namespace attn::cuda_internal

#endif  // ATTN_INTERNAL_CUDA_CUBLAS_LIBRARY_H_
