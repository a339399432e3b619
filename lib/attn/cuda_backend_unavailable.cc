// The CUDA backend in a build without CUDA (nvcc was not found, or
// ATTN_WITH_CUDA=OFF): Create says so, and nothing else is reachable.
#include "absl/status/status.h"
#include "attn/cuda_backend.h"

namespace attn {

class CudaBackend::Impl {};

bool CudaBackend::Compiled() { return false; }

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const Options&) {
  return absl::UnimplementedError(
      "cuda: this build has no CUDA backend (nvcc was not found when it was "
      "configured; configure with -DATTN_WITH_CUDA=ON where the CUDA toolkit "
      "is installed)");
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

std::string CudaBackend::description() const { return name(); }

namespace {
absl::Status NotBuilt() {
  return absl::UnimplementedError("cuda: not built");
}
}  // namespace

std::vector<std::string> CudaBackend::implementation_names() const {
  return {};
}

absl::StatusOr<const char*> CudaBackend::MaskedSoftmax(
    const MaskedSoftmaxParams&) {
  return NotBuilt();
}
absl::StatusOr<const char*> CudaBackend::BatchMatmul(
    const BatchMatmulParams&) {
  return NotBuilt();
}
absl::StatusOr<const char*> CudaBackend::ScaledDotProductAttention(
    const AttentionParams&) {
  return NotBuilt();
}
absl::StatusOr<const char*> CudaBackend::AdditiveAttention(
    const AdditiveAttentionParams&) {
  return NotBuilt();
}
absl::StatusOr<const char*> CudaBackend::NadarayaWatson(
    const NadarayaWatsonParams&) {
  return NotBuilt();
}
bool CudaBackend::SpreadsKeysAcrossThreads(const AttentionParams&) const {
  return false;
}
std::optional<HeldMemoryStats> CudaBackend::held_memory_stats() const {
  return std::nullopt;
}
CudaBackend::MemoryStats CudaBackend::memory_stats() const { return {}; }
void CudaBackend::ResetPeakMemory() {}

}  // namespace attn
