// Where the GPU starts to pay: every operation at sizes from a toy call up,
// one call at a time from host memory (as the server makes them), on the CPU
// engine and on the CUDA engine, and the work (attn/work.h's estimate) from
// which the GPU is faster at every larger size. That crossover is what the
// server's --cuda_min_flops should be on that machine.
//
//   cuda_crossover_bench [--min_time_s=0.2]
//
// Prints a Markdown table per operation, then one line per operation
// "crossover OP FLOPS" and "suggested --cuda_min_flops=F" (the smallest
// crossover: above it, a call of any operation is at worst a little slower
// on the GPU, and off the CPU). Without a usable GPU it times the CPU alone,
// says why, and exits 1. Latency of lone calls, not throughput under load:
// a busy CPU makes the GPU pay off sooner.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "attn/engine.h"
#include "attn/tensor.h"
#include "attn/testing/random.h"
#include "attn/validate.h"
#include "attn/work.h"

namespace {

using Clock = std::chrono::steady_clock;

// One call of an operation at one size, on any engine.
struct Step {
  double flops;
  std::string shape;
  std::function<absl::StatusOr<attn::OpResult>(attn::Engine&)> call;
};

struct Ladder {
  std::string op;
  std::vector<Step> steps;
};

// The work attn/work.h counts for a request: what the engine's routing
// compares with --cuda_min_flops.
template <typename Plan>
double Work(const absl::StatusOr<Plan>& plan) {
  return plan.ok() ? attn::EstimatedFlops(plan->params) : -1;
}

// Seeded inputs that outlive the calls made of them.
class Inputs {
 public:
  attn::TensorView Normal(attn::Shape shape) {
    tensors_.push_back(std::make_unique<attn::Tensor>(
        attn::testing::RandomNormal(rng_, std::move(shape))));
    return tensors_.back()->view();
  }

 private:
  std::mt19937 rng_{1};
  std::vector<std::unique_ptr<attn::Tensor>> tensors_;
};

std::vector<Ladder> Ladders(Inputs& in) {
  std::vector<Ladder> ladders(5);
  ladders[0].op = "attention";  // self-attention (1, L, 64), the server's
  for (int64_t l = 1; l <= 1024; l *= 2) {
    attn::AttentionRequest r;
    r.queries = in.Normal({1, l, 64});
    r.keys = in.Normal({1, l, 64});
    r.values = in.Normal({1, l, 64});
    ladders[0].steps.push_back(
        {Work(attn::ValidateAttention(r)), "1x" + std::to_string(l) + "x64",
         [r](attn::Engine& e) { return e.ScaledDotProductAttention(r); }});
  }
  ladders[1].op = "masked_softmax";  // (1, R, R)
  for (int64_t n = 1; n <= 2048; n *= 2) {
    attn::MaskedSoftmaxRequest r;
    r.x = in.Normal({1, n, n});
    ladders[1].steps.push_back({Work(attn::ValidateMaskedSoftmax(r)), "1x" + std::to_string(n) + "x" + std::to_string(n),
                                [r](attn::Engine& e) { return e.MaskedSoftmax(r); }});
  }
  ladders[2].op = "batch_matmul";  // (1, N, N) x (1, N, N)
  for (int64_t n = 1; n <= 512; n *= 2) {
    attn::BatchMatmulRequest r;
    r.a = in.Normal({1, n, n});
    r.b = in.Normal({1, n, n});
    ladders[2].steps.push_back({Work(attn::ValidateBatchMatmul(r)), "1x" + std::to_string(n) + "x" + std::to_string(n),
                                [r](attn::Engine& e) { return e.BatchMatmul(r); }});
  }
  ladders[3].op = "additive_attention";  // q, k, v (1, L, 16), h = 32
  for (int64_t l = 1; l <= 512; l *= 2) {
    attn::AdditiveAttentionRequest r;
    r.queries = in.Normal({1, l, 16});
    r.keys = in.Normal({1, l, 16});
    r.values = in.Normal({1, l, 16});
    r.w_q = in.Normal({32, 16});
    r.w_k = in.Normal({32, 16});
    r.w_v = in.Normal({32});
    ladders[3].steps.push_back(
        {Work(attn::ValidateAdditiveAttention(r)), "1x" + std::to_string(l) + "x16",
         [r](attn::Engine& e) { return e.AdditiveAttention(r); }});
  }
  ladders[4].op = "nadaraya_watson";  // N queries against N points, 1-d
  for (int64_t n = 1; n <= 4096; n *= 2) {
    attn::NadarayaWatsonRequest r;
    r.x_train = in.Normal({n, 1});
    r.y_train = in.Normal({n, 1});
    r.x_query = in.Normal({n, 1});
    ladders[4].steps.push_back({Work(attn::ValidateNadarayaWatson(r)), std::to_string(n) + " x " + std::to_string(n),
                                [r](attn::Engine& e) { return e.NadarayaWatson(r); }});
  }
  return ladders;
}

// Median microseconds of one call, over at least `min_time_s` (and at least
// 5 calls) after 3 warm-ups; a negative value when the call fails.
double MedianMicros(const Step& step, attn::Engine& engine, double min_time_s,
                    std::string* implementation) {
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<attn::OpResult> result = step.call(engine);
    if (!result.ok()) {
      std::fprintf(stderr, "cuda_crossover_bench: %s: %s\n", step.shape.c_str(),
                   std::string(result.status().message()).c_str());
      return -1;
    }
    *implementation = result->implementation;
  }
  std::vector<double> micros;
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(min_time_s));
  while (micros.size() < 5 || (Clock::now() < end && micros.size() < 100000)) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<attn::OpResult> result = step.call(engine);
    micros.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!result.ok()) return -1;
  }
  std::nth_element(micros.begin(), micros.begin() + micros.size() / 2,
                   micros.end());
  return micros[micros.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double min_time_s = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--min_time_s=", 0) == 0 &&
        absl::SimpleAtod(arg.substr(13), &min_time_s) && min_time_s > 0) {
      continue;
    }
    std::fprintf(stderr, "usage: %s [--min_time_s=0.2]\n", argv[0]);
    return 64;
  }
  attn::EngineOptions cpu_options;
  cpu_options.device = attn::Device::kCpu;
  auto cpu = attn::Engine::Create(cpu_options);
  if (!cpu.ok()) {
    std::fprintf(stderr, "cuda_crossover_bench: the CPU engine: %s\n",
                 std::string(cpu.status().message()).c_str());
    return 1;
  }
  attn::EngineOptions gpu_options;
  gpu_options.device = attn::Device::kCuda;
  gpu_options.cuda_min_work = attn::MinimumWork{};  // every call it takes
  auto gpu = attn::Engine::Create(gpu_options);
  if (!gpu.ok()) {
    std::printf("no GPU (%s): the CPU alone\n\n",
                std::string(gpu.status().message()).c_str());
  } else {
    std::printf("GPU: %s\n", (*gpu)->backend_descriptions().front().c_str());
  }
  std::printf("CPU: %s\n\n", (*cpu)->backend_descriptions().front().c_str());

  Inputs inputs;
  double suggested = std::numeric_limits<double>::infinity();
  std::vector<std::string> crossovers;
  for (const Ladder& ladder : Ladders(inputs)) {
    std::printf("%s\n\n| shape | flops | CPU µs | GPU µs | GPU/CPU | GPU ran on |\n"
                "|---|---:|---:|---:|---:|---|\n",
                ladder.op.c_str());
    // The smallest step from which the GPU wins at every larger step.
    double crossover = std::numeric_limits<double>::infinity();
    for (const Step& step : ladder.steps) {
      std::string cpu_ran, gpu_ran = "-";
      const double cpu_us = MedianMicros(step, **cpu, min_time_s, &cpu_ran);
      double gpu_us = -1;
      if (gpu.ok()) gpu_us = MedianMicros(step, **gpu, min_time_s, &gpu_ran);
      if (cpu_us < 0 || (gpu.ok() && gpu_us < 0)) return 1;
      if (gpu_us >= 0) {
        std::printf("| %s | %.3g | %.1f | %.1f | %.2f | %s |\n", step.shape.c_str(),
                    step.flops, cpu_us, gpu_us, gpu_us / cpu_us, gpu_ran.c_str());
        // A GPU loss above a win resets the crossover; a step the GPU
        // backend passed on (reference, CPU) counts as no win.
        const bool gpu_wins = gpu_us < cpu_us && gpu_ran == "cuda";
        if (!gpu_wins) {
          crossover = std::numeric_limits<double>::infinity();
        } else if (crossover == std::numeric_limits<double>::infinity()) {
          crossover = step.flops;
        }
      } else {
        std::printf("| %s | %.3g | %.1f | - | - | - |\n", step.shape.c_str(),
                    step.flops, cpu_us);
      }
      std::fflush(stdout);
    }
    std::printf("\n");
    crossovers.push_back("crossover " + ladder.op + " " +
                         (gpu.ok() ? std::to_string(crossover) : "n/a"));
    suggested = std::min(suggested, crossover);
  }
  for (const std::string& line : crossovers) std::printf("%s\n", line.c_str());
  if (!gpu.ok()) return 1;
  std::printf("suggested --cuda_min_flops=%.3g\n", suggested);
  return 0;
}
