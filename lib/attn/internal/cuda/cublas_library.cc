#include "attn/internal/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifndef ATTN_CUDA_LIBRARY_DIR
#define ATTN_CUDA_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif

namespace attn::cuda_internal {
namespace {

template <typename Function>
bool Resolve(void* handle, const char* name, Function* function,
             std::string* missing) {
  *function = reinterpret_cast<Function>(dlsym(handle, name));
  if (*function == nullptr) absl::StrAppend(missing, missing->empty() ? "" : ", ", name);
  return *function != nullptr;
}

absl::StatusOr<CublasLibrary> Load() {
  const std::string file = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  std::string errors;
  void* handle = nullptr;
  for (const std::string& path :
       {file, absl::StrCat(ATTN_CUDA_LIBRARY_DIR, "/", file)}) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* error = dlerror();
    absl::StrAppend(&errors, errors.empty() ? "" : "; ",
                    error != nullptr ? error : path);
  }
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda: cannot load ", file, " (cuBLAS): ", errors));
  }
  CublasLibrary library;
  std::string missing;
  Resolve(handle, "cublasCreate_v2", &library.create, &missing);
  Resolve(handle, "cublasDestroy_v2", &library.destroy, &missing);
  Resolve(handle, "cublasSetStream_v2", &library.set_stream, &missing);
  Resolve(handle, "cublasSetMathMode", &library.set_math_mode, &missing);
  Resolve(handle, "cublasGemmStridedBatchedEx",
          &library.gemm_strided_batched_ex, &missing);
  Resolve(handle, "cublasGetStatusString", &library.get_status_string,
          &missing);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda: ", file, " lacks ", missing));
  }
  return library;  // the handle stays open for the process's lifetime
}

}  // namespace

absl::StatusOr<const CublasLibrary*> LoadCublas() {
  static const auto* const loaded =
      new absl::StatusOr<CublasLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &loaded->value();
}

}  // namespace attn::cuda_internal
