// The library's entry point: validates a request, allocates its outputs and
// runs it on the first backend of an ordered list that takes it. The list
// always ends in the reference backend, so every valid request runs.
//
// Finite inputs never yield a NaN or infinite softmax-based result (every
// operation but BatchMatmul, whose float32 overflow is a true overflow):
// where a float32 kernel
// overflows (a score beyond 3.4e38), the call is redone on the reference
// backend, which computes in double, and the result says so. Non-finite
// inputs propagate to the rows they touch.
//
// Thread safety: every method may be called concurrently from many threads;
// an Engine is immutable after Create. Methods block until the result is
// ready. Status codes: INVALID_ARGUMENT for a malformed request (the message
// names the argument, the shape it got and the shape it expected; not
// retryable), RESOURCE_EXHAUSTED when memory cannot be had, INTERNAL for a
// failure inside a backend library.
#ifndef ATTN_ENGINE_H_
#define ATTN_ENGINE_H_

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attn/backend.h"
#include "attn/cpu_isa.h"
#include "attn/minimum_work_backend.h"
#include "attn/ops.h"

namespace attn {

// Where the optimized kernels run.
enum class Device {
  kCpu,   // oneDNN on the CPU
  kCuda,  // the CUDA backend first; Engine::Create fails without a usable GPU
  kAuto,  // the CUDA backend when a usable GPU is present, else the CPU
};

struct EngineOptions {
  Device device = Device::kCpu;
  // The CUDA backend's device ordinal (kCuda, kAuto).
  int cuda_device = 0;
  // Calls estimated (attn/work.h) at fewer floating-point operations than
  // their operation's threshold skip the CUDA backend and run on the CPU, so
  // a toy call does not pay a GPU round trip (see
  // attn/minimum_work_backend.h); an infinite one keeps the operation on the
  // CPU. All 0 (the default): the GPU takes every call it can. The server
  // sets them (--cuda_min_flops, --cuda_min_flops_by_operation).
  MinimumWork cuda_min_work;
  // Device memory for held memories' copies (attn/held_memory.h), least
  // recently used out first; 0: half of the GPU's memory.
  int64_t cuda_held_memory_bytes = 0;
  // Told of each held memory placed on the GPU, evicted, refused or freed
  // (for a log); called on the calling threads. May be empty.
  std::function<void(const HeldMemoryEvent&)> on_held_memory_event;
  // Use the oneDNN CPU backend (it runs on every CPU). Off: the reference
  // backend runs everything (slow; for tests and debugging).
  bool use_onednn = true;
  // Upper bound on the threads one call may use; 0 means OpenMP's default
  // (OMP_NUM_THREADS, else the core count).
  int max_threads = 0;
  // Calls with fewer floating-point operations than this run on the calling
  // thread alone: waking a second OpenMP thread costs microseconds, and when
  // the other core is busy a barrier can stall for milliseconds. A server
  // gets its parallelism from concurrent requests instead.
  double single_thread_below_flops = 8e6;
  // Caps the instruction set of the CPU backend's own kernels (unset: the
  // best this CPU has, subject to the process-wide ATTN_MAX_CPU_ISA; see
  // attn/cpu_isa.h). For tests and for pinning a fleet of mixed CPUs to the
  // same arithmetic.
  std::optional<CpuIsa> max_cpu_isa;
  // CPU implementations (OpResult::implementation's names) never run: each
  // call goes to the next in its list that takes it. For tests, to run a
  // general kernel on calls a specialised one before it would take; the
  // last of each list takes every call, so skipping it fails the calls left
  // to it (UNIMPLEMENTED).
  std::vector<std::string> skipped_cpu_implementations;
};

class Engine {
 public:
  // FAILED_PRECONDITION for Device::kCuda without a usable GPU (the message
  // says why); kAuto then falls back to the CPU and says why in notes().
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options);
  // An engine over an explicit backend list (tried in order); the reference
  // backend is appended when the list does not already end in it.
  static absl::StatusOr<std::unique_ptr<Engine>> CreateWithBackends(
      std::vector<std::unique_ptr<Backend>> backends);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  absl::StatusOr<OpResult> MaskedSoftmax(const MaskedSoftmaxRequest& request);
  absl::StatusOr<OpResult> BatchMatmul(const BatchMatmulRequest& request);
  absl::StatusOr<OpResult> ScaledDotProductAttention(
      const AttentionRequest& request);
  absl::StatusOr<OpResult> AdditiveAttention(
      const AdditiveAttentionRequest& request);
  absl::StatusOr<OpResult> NadarayaWatson(
      const NadarayaWatsonRequest& request);
  // Runs on the calling thread with the library's own gradient code (a fit is
  // O(epochs * n^2) with tiny n in practice); implementation is "reference".
  absl::StatusOr<FitBandwidthResult> FitBandwidth(
      const FitBandwidthRequest& request);

  // Runs every operation once on small inputs, so that one-time costs
  // (oneDNN's JIT code generation, first-touch of its buffers; ~2 ms; the
  // GPU's module loads, whatever cuda_min_work says) are paid at start-up
  // rather than by the first requests. Blocks; returns the first failure.
  absl::Status WarmUp();

  // Whether the backend that runs `request` first spreads one call's keys
  // across its threads (the CPU backend's key shares, over a long memory):
  // a batch of calls over the same keys then gains from every core at once.
  // Shapes alone decide it; false for a request the engine refuses.
  bool SpreadsKeysAcrossThreads(const AttentionRequest& request) const;

  // Where calls go first: kCuda when Create placed the CUDA backend first
  // (kCuda, or kAuto with a usable GPU), else kCpu.
  Device device() const { return device_; }

  // What the device backend holds of held memories; none without one.
  std::optional<HeldMemoryStats> held_memory_stats() const;

  // Every implementation a result of this engine may name, with its
  // backend: (OpResult::implementation, OpResult::backend) pairs, each once,
  // in the order the backends are tried. For binding metric labels at
  // start-up.
  std::vector<std::pair<std::string, std::string>> implementations() const;

  // The backends in the order they are tried, e.g. {"onednn-cpu", "reference"}.
  std::vector<std::string> backend_names() const;
  // The same, described (the CUDA backend names its GPU).
  std::vector<std::string> backend_descriptions() const;
  // What Create decided and why, for a start-up log (e.g. why kAuto fell
  // back to the CPU). Empty when there is nothing to say.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  explicit Engine(std::vector<std::unique_ptr<Backend>> backends);

  // WarmUp's calls, one per operation and path.
  absl::Status RunWarmUpCalls();

  // Runs `method` on the first backend that takes `params`; names the
  // implementation and the backend that ran in `result`. `inputs` and
  // `result` serve the overflow check (see engine.cc); empty `inputs` turn
  // it off. `late_checks` is the validation left until after the kernel
  // (attention's deferred range check), run before any redo. Where
  // `outputs_finite` is given and the kernel set it, the output is not
  // scanned (AttentionParams::outputs_finite).
  template <typename Params, typename Method>
  absl::Status Dispatch(
      const Params& params, Method method,
      std::initializer_list<TensorView> inputs, OpResult* result,
      absl::FunctionRef<absl::Status()> late_checks =
          [] { return absl::OkStatus(); },
      const bool* outputs_finite = nullptr);

  const std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::string> notes_;
  Device device_ = Device::kCpu;
};

}  // namespace attn

#endif  // ATTN_ENGINE_H_
