// Times the CUDA backend's attention on a GPU, for bench/cuda_bench.sh, which
// sets it beside PyTorch's scaled_dot_product_attention in one run.
//
//   cuda_attention_bench [--iterations=N] [--lengths=1024,4096] [--dims=64,128]
//
// Prints one JSON object per line:
//  - "fused": the fused kernel alone on device-resident inputs, timed with
//    CUDA events over N launches after 3 warm-ups (the figure comparable with
//    PyTorch's, whose tensors also live on the GPU), for fp32, bf16, fp16;
//  - "call": a whole CudaBackend::ScaledDotProductAttention call from host
//    memory (copies through pinned staging included) and the device pool's
//    peak bytes, which must grow linearly in L.
// Exits 1 with a message when no GPU is usable.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "attn/cuda_backend.h"
#include "attn/internal/cuda/kernels.h"
#include "attn/ops.h"

namespace {

using attn::cuda_internal::ElementType;

constexpr int64_t kBatch = 8, kHeads = 16;

bool Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::fprintf(stderr, "cuda_attention_bench: %s: %s\n", what,
               cudaGetErrorString(error));
  return false;
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t value;
    if (absl::SimpleAtoi(part, &value)) values.push_back(value);
  }
  return values;
}

const char* TypeName(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return "fp32";
    case ElementType::kBFloat16:
      return "bf16";
    case ElementType::kFloat16:
      return "fp16";
  }
  return "?";
}

// The fused kernel on device inputs: milliseconds per launch.
bool TimeFused(int64_t length, int64_t d, ElementType type, int iterations,
               const std::vector<float>& host, double* ms) {
  const int64_t count = kBatch * kHeads * length * d;
  float* inputs[3] = {};
  void* operands[3] = {};
  float* out = nullptr;
  bool ok = true;
  for (int i = 0; i < 3 && ok; ++i) {
    ok = Check(cudaMalloc(reinterpret_cast<void**>(&inputs[i]), count * sizeof(float)), "cudaMalloc") &&
         Check(cudaMemcpy(inputs[i], host.data(), count * sizeof(float),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy");
    operands[i] = inputs[i];
    if (ok && type != ElementType::kFloat32) {
      ok = Check(cudaMalloc(&operands[i], count * 2), "cudaMalloc") &&
           Check(attn::cuda_internal::LaunchConvert(inputs[i], operands[i],
                                                    count, type, nullptr),
                 "convert");
    }
  }
  ok = ok && Check(cudaMalloc(reinterpret_cast<void**>(&out), count * sizeof(float)), "cudaMalloc");
  attn::cuda_internal::FusedAttentionArgs args;
  args.q = operands[0];
  args.k = operands[1];
  args.v = operands[2];
  args.out = out;
  args.batch = kBatch;
  args.heads = kHeads;
  args.lq = args.lk = length;
  args.d = d;
  args.scale = 1.0f / std::sqrt(static_cast<float>(d));
  args.type = type;
  cudaEvent_t start, stop;
  ok = ok && Check(cudaEventCreate(&start), "event") &&
       Check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3 && ok; ++i) {
    ok = Check(attn::cuda_internal::LaunchFusedAttention(args, nullptr), "launch");
  }
  ok = ok && Check(cudaEventRecord(start), "record");
  for (int i = 0; i < iterations && ok; ++i) {
    ok = Check(attn::cuda_internal::LaunchFusedAttention(args, nullptr), "launch");
  }
  float elapsed = 0.0f;
  ok = ok && Check(cudaEventRecord(stop), "record") &&
       Check(cudaEventSynchronize(stop), "the kernels") &&
       Check(cudaEventElapsedTime(&elapsed, start, stop), "elapsed");
  *ms = elapsed / iterations;
  for (int i = 0; i < 3; ++i) {
    if (operands[i] != inputs[i]) cudaFree(operands[i]);
    cudaFree(inputs[i]);
  }
  cudaFree(out);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20;
  std::vector<int64_t> lengths = {1024, 4096}, dims = {64, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--iterations=", 0) == 0) iterations = std::atoi(arg.c_str() + 13);
    else if (arg.rfind("--lengths=", 0) == 0) lengths = ParseList(arg.substr(10));
    else if (arg.rfind("--dims=", 0) == 0) dims = ParseList(arg.substr(7));
    else {
      std::fprintf(stderr, "usage: %s [--iterations=N] [--lengths=L,...] [--dims=d,...]\n", argv[0]);
      return 64;
    }
  }
  auto backend = attn::CudaBackend::Create(attn::CudaBackend::Options{});
  if (!backend.ok()) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n",
                 std::string(backend.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "cuda_attention_bench: %s\n", (*backend)->description().c_str());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (int64_t d : dims) {
    for (int64_t length : lengths) {
      std::vector<float> host(kBatch * kHeads * length * d);
      for (float& value : host) value = normal(rng);
      const double flops = 4.0 * kBatch * kHeads * length * length * d;
      for (ElementType type :
           {ElementType::kFloat32, ElementType::kBFloat16, ElementType::kFloat16}) {
        double ms = 0.0;
        if (!TimeFused(length, d, type, iterations, host, &ms)) return 1;
        std::printf(
            "{\"kind\":\"fused\",\"precision\":\"%s\",\"B\":%lld,\"H\":%lld,"
            "\"L\":%lld,\"d\":%lld,\"ms\":%.4f,\"tflops\":%.2f}\n",
            TypeName(type), static_cast<long long>(kBatch),
            static_cast<long long>(kHeads), static_cast<long long>(length),
            static_cast<long long>(d), ms, flops / ms * 1e-9);
      }
      // A whole backend call from host memory, fp32: time and pool peak.
      std::vector<float> out(host.size());
      attn::AttentionParams params;
      params.q = params.k = params.v = host.data();
      params.out = out.data();
      params.batch = kBatch;
      params.heads = kHeads;
      params.lq = params.lk = length;
      params.d = params.dv = d;
      params.scale = 1.0f / std::sqrt(static_cast<float>(d));
      if (!(*backend)->ScaledDotProductAttention(params).ok())
        return 1;  // warm
      (*backend)->ResetPeakMemory();
      // The call blocks until its output is in host memory: wall time.
      const auto start = std::chrono::steady_clock::now();
      absl::Status status =
          (*backend)->ScaledDotProductAttention(params).status();
      const double elapsed =
          std::chrono::duration<double, std::milli>(
              std::chrono::steady_clock::now() - start).count();
      if (!status.ok()) {
        std::fprintf(stderr, "cuda_attention_bench: %s\n", std::string(status.message()).c_str());
        return 1;
      }
      std::printf(
          "{\"kind\":\"call\",\"precision\":\"fp32\",\"B\":%lld,\"H\":%lld,"
          "\"L\":%lld,\"d\":%lld,\"ms\":%.4f,\"peak_mib\":%.1f}\n",
          static_cast<long long>(kBatch), static_cast<long long>(kHeads),
          static_cast<long long>(length), static_cast<long long>(d), elapsed,
          (*backend)->memory_stats().peak_bytes_in_use / 1048576.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
