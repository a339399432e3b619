// Times attention over a memory that stays on the GPU (a server's stored
// memory: keys and values [N, 64]), for run_gpu_checks.sh's `kernel` step,
// which sets it beside PyTorch's (bench/torch_memory_gpu.py) in one call.
//
//   cuda_memory_bench [--sizes=65536,262144,1048576] [--rows=1,64]
//
// Prints CSV rows (header first):
//  - "copy": the device-to-device copy bandwidth (bytes read + written), the
//    ceiling one pass over the memory is measured against;
//  - "kernel": each kernel that may run the call, alone on device-resident
//    inputs, as the backend plans it (key splits and their merge included):
//    cuda-split-keys (the fused tensor-core kernel) always, cuda-decode too
//    for at most 4 rows; median of 7 rounds of 20 launches timed with CUDA
//    events; the memory's bytes over that time, and its share of the copy
//    bandwidth;
//  - "call": a whole Engine call over a held memory (attn/held_memory.h):
//    the queries in, the kernel, the result out, from host memory, timed on
//    the host (median of 7 rounds of 20 calls).
// Exits 1 with a message when no GPU is usable.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "attn/bfloat16.h"
#include "attn/engine.h"
#include "attn/held_memory.h"
#include "attn/internal/cuda/kernels.h"
#include "attn/ops.h"

ABSL_FLAG(std::vector<std::string>, sizes,
          std::vector<std::string>({"65536", "262144", "1048576"}),
          "Memory sizes (key-value pairs), comma-separated.");
ABSL_FLAG(std::vector<std::string>, rows, std::vector<std::string>({"1", "64"}),
          "Query rows per call, comma-separated.");

namespace {

using attn::cuda_internal::ElementType;

constexpr int64_t kDim = 64;

// Exits 1, naming `what`, unless `error` is cudaSuccess.
void Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "cuda_memory_bench: %s: %s\n", what,
               cudaGetErrorString(error));
  std::exit(1);
}

// The numbers of a list flag; a part that is not one is an error.
std::vector<int64_t> Numbers(const std::vector<std::string>& parts,
                             const char* flag) {
  std::vector<int64_t> values;
  for (const std::string& part : parts) {
    int64_t value;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      std::fprintf(stderr, "cuda_memory_bench: --%s: '%s' is not a count\n",
                   flag, part.c_str());
      std::exit(1);
    }
    values.push_back(value);
  }
  return values;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median microseconds per call of `launch`, timed with events.
template <typename Launch>
double DeviceMicros(Launch launch) {
  cudaEvent_t start, end;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&end), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) launch();
  Check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> rounds;
  for (int round = 0; round < 7; ++round) {
    Check(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < 20; ++i) launch();
    Check(cudaEventRecord(end), "cudaEventRecord");
    Check(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
    rounds.push_back(ms * 1e3 / 20);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return Median(rounds);
}

double CopyBandwidthGbps() {
  const size_t bytes = size_t{1} << 30;
  void *a, *b;
  Check(cudaMalloc(&a, bytes), "cudaMalloc");
  Check(cudaMalloc(&b, bytes), "cudaMalloc");
  Check(cudaMemset(a, 1, bytes), "cudaMemset");
  const double us = DeviceMicros([&] {
    Check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
  });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / us / 1e3;
}

float* DeviceFloats(int64_t count) {
  void* device;
  Check(cudaMalloc(&device, static_cast<size_t>(count) * 4), "cudaMalloc");
  return static_cast<float*>(device);
}

void* ToDevice(const void* host, size_t bytes) {
  void* device;
  Check(cudaMalloc(&device, bytes), "cudaMalloc");
  Check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  return device;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<int64_t> sizes = Numbers(absl::GetFlag(FLAGS_sizes), "sizes");
  const std::vector<int64_t> row_counts =
      Numbers(absl::GetFlag(FLAGS_rows), "rows");
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, 0) != cudaSuccess) {
    std::fprintf(stderr, "cuda_memory_bench: no usable GPU\n");
    return 1;
  }
  attn::EngineOptions options;
  options.device = attn::Device::kCuda;
  auto engine = attn::Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "cuda_memory_bench: %s\n",
                 std::string(engine.status().message()).c_str());
    return 1;
  }
  const double copy_gbps = CopyBandwidthGbps();
  std::printf("# %s, %d SMs\n", properties.name, properties.multiProcessorCount);
  std::printf(
      "what,N,dtype,Q,implementation,splits,us,queries_per_s,GBps,"
      "share_of_copy\n");
  std::printf("copy,,,,,,,,%.0f,1.00\n", copy_gbps);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const int64_t n : sizes) {
    std::vector<float> keys(n * kDim), values(n * kDim);
    for (float& x : keys) x = normal(rng);
    for (float& x : values) x = normal(rng);
    std::vector<uint16_t> key_bits(keys.size()), value_bits(values.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      key_bits[i] = attn::BFloat16Bits(keys[i]);
      value_bits[i] = attn::BFloat16Bits(values[i]);
    }
    for (const ElementType type : {ElementType::kFloat32, ElementType::kBFloat16}) {
      const bool bf16 = type == ElementType::kBFloat16;
      const size_t element = bf16 ? 2 : 4;
      const size_t memory_bytes = 2 * n * kDim * element;
      void* k = ToDevice(bf16 ? static_cast<const void*>(key_bits.data())
                              : keys.data(),
                         n * kDim * element);
      void* v = ToDevice(bf16 ? static_cast<const void*>(value_bits.data())
                              : values.data(),
                         n * kDim * element);
      attn::HeldMemory held("bench");
      for (const int64_t rows : row_counts) {
        std::vector<float> queries(rows * kDim);
        for (float& x : queries) x = normal(rng);
        std::vector<uint16_t> query_bits(queries.size());
        for (size_t i = 0; i < queries.size(); ++i) {
          query_bits[i] = attn::BFloat16Bits(queries[i]);
        }
        void* q = ToDevice(bf16 ? static_cast<const void*>(query_bits.data())
                                : queries.data(),
                           rows * kDim * element);
        attn::cuda_internal::FusedAttentionArgs args;
        args.q = q;
        args.k = k;
        args.v = v;
        args.batch = args.heads = 1;
        args.lq = rows;
        args.lk = n;
        args.d = kDim;
        args.scale = 0.125f;
        args.type = type;
        const attn::cuda_internal::FusedAttentionPlan plan =
            attn::cuda_internal::PlanFusedAttention(
                args, properties.multiProcessorCount,
                static_cast<int64_t>(properties.sharedMemPerMultiprocessor));
        args.block_rows = plan.block_rows;
        args.key_splits = plan.key_splits;
        args.tiles_per_split = plan.tiles_per_split;
        float* out = DeviceFloats(rows * kDim);
        float* partial_out = nullptr;
        float* partial_stats = nullptr;
        if (plan.key_splits > 1) {
          partial_out = DeviceFloats(plan.key_splits * rows * kDim);
          partial_stats = DeviceFloats(plan.key_splits * rows * 2);
        }
        args.out = out;
        args.partial_out = partial_out;
        args.partial_stats = partial_stats;
        const char* name = bf16 ? "bf16" : "fp32";
        auto print = [&](const char* implementation, int64_t splits,
                         double us) {
          std::printf("kernel,%lld,%s,%lld,%s,%lld,%.1f,%.0f,%.0f,%.2f\n",
                      static_cast<long long>(n), name,
                      static_cast<long long>(rows), implementation,
                      static_cast<long long>(splits), us, rows / us * 1e6,
                      memory_bytes / us / 1e3,
                      memory_bytes / us / 1e3 / copy_gbps);
        };
        print("cuda-split-keys", plan.key_splits, DeviceMicros([&] {
                Check(attn::cuda_internal::LaunchFusedAttention(args, nullptr),
                      "launch");
              }));
        if (attn::cuda_internal::DecodeAttentionTakes(rows, kDim)) {
          attn::cuda_internal::DecodeAttentionArgs decode;
          static_cast<attn::cuda_internal::AttentionOperands&>(decode) = args;
          decode.keys_per_split = attn::cuda_internal::PlanDecodeAttention(
              decode, properties.multiProcessorCount);
          const int64_t splits =
              (n + decode.keys_per_split - 1) / decode.keys_per_split;
          decode.partial_out = DeviceFloats(splits * rows * kDim);
          decode.partial_stats = DeviceFloats(splits * rows * 2);
          print("cuda-decode", splits, DeviceMicros([&] {
                  Check(attn::cuda_internal::LaunchDecodeAttention(decode,
                                                                    nullptr),
                        "launch");
                }));
          cudaFree(decode.partial_out);
          cudaFree(decode.partial_stats);
        }
        // The whole call over the held memory, from host memory.
        attn::AttentionRequest request;
        request.queries = {queries.data(), {1, rows, kDim}};
        if (bf16) {
          request.keys = {nullptr, {1, n, kDim}};
          request.values = {nullptr, {1, n, kDim}};
          request.keys_bfloat16 = key_bits.data();
          request.values_bfloat16 = value_bits.data();
          request.precision = attn::Precision::kBFloat16;
        } else {
          request.keys = {keys.data(), {1, n, kDim}};
          request.values = {values.data(), {1, n, kDim}};
        }
        request.held = &held;
        std::vector<double> rounds;
        std::string implementation;
        for (int round = 0; round < 8; ++round) {
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < 20; ++i) {
            auto result = (*engine)->ScaledDotProductAttention(request);
            if (!result.ok()) {
              std::fprintf(stderr, "cuda_memory_bench: %s\n",
                           std::string(result.status().message()).c_str());
              return 1;
            }
            implementation = result->implementation;
          }
          const std::chrono::duration<double, std::micro> took =
              std::chrono::steady_clock::now() - start;
          if (round > 0) rounds.push_back(took.count() / 20);  // 0 places it
        }
        const double call_us = Median(rounds);
        std::printf("call,%lld,%s,%lld,%s,,%.1f,%.0f,%.0f,%.2f\n",
                    static_cast<long long>(n), name,
                    static_cast<long long>(rows), implementation.c_str(),
                    call_us, rows / call_us * 1e6, memory_bytes / call_us / 1e3,
                    memory_bytes / call_us / 1e3 / copy_gbps);
        std::fflush(stdout);
        cudaFree(q);
        cudaFree(out);
        cudaFree(partial_out);
        cudaFree(partial_stats);
      }
      cudaFree(k);
      cudaFree(v);
    }
  }
  return 0;
}
