#include "attn/engine.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attn/cuda_backend.h"
#include "attn/fit.h"
#include "attn/minimum_work_backend.h"
#include "attn/onednn_backend.h"
#include "attn/reference.h"
#include "attn/status_macros.h"
#include "attn/validate.h"

namespace attn {
namespace {

template <typename Params, typename = void>
constexpr bool kHasWeights = false;
template <typename Params>
constexpr bool kHasWeights<
    Params, std::void_t<decltype(std::declval<Params&>().weights)>> = true;

// Allocates the plan's outputs into `result` and points the params at them.
template <typename Params>
absl::Status AllocateOutputs(Plan<Params>* plan, OpResult* result) {
  try {
    result->output = Tensor::Uninitialized(plan->output_shape);
    if (!plan->weights_shape.empty()) {
      result->weights = Tensor::Uninitialized(plan->weights_shape);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate the output ", ShapeToString(plan->output_shape)));
  }
  plan->params.out = result->output.data.data();
  if constexpr (kHasWeights<Params>) {
    if (!result->weights.empty()) {
      plan->params.weights = result->weights.data.data();
    }
  }
  return absl::OkStatus();
}

// x * 0 is 0 for finite x and NaN for NaN and infinities, so the sum is 0
// exactly when every element is finite: a branch-free loop that vectorizes.
bool AllFinite(const float* data, int64_t count) {
  float probe = 0.0f;
#pragma omp simd reduction(+ : probe)
  for (int64_t i = 0; i < count; ++i) probe += data[i] * 0.0f;
  return probe == 0.0f;
}

// The output alone: every weight a backend computes feeds the output through
// a product, and NaN * anything is NaN, so a non-finite weight shows there.
bool AllFinite(const OpResult& result) {
  return AllFinite(result.output.data.data(),
                   static_cast<int64_t>(result.output.data.size()));
}

bool AllFinite(std::initializer_list<TensorView> inputs) {
  for (const TensorView& input : inputs) {
    if (input.data != nullptr &&
        !AllFinite(input.data, input.num_elements())) {
      return false;
    }
  }
  return true;
}

}  // namespace

Engine::Engine(std::vector<std::unique_ptr<Backend>> backends)
    : backends_(std::move(backends)) {}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options) {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::string> notes;
  Device device = Device::kCpu;
  if (options.device != Device::kCpu) {
    CudaBackend::Options cuda_options;
    cuda_options.device = options.cuda_device;
    cuda_options.held_memory_bytes = options.cuda_held_memory_bytes;
    cuda_options.on_held_memory_event = options.on_held_memory_event;
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda =
        CudaBackend::Create(cuda_options);
    if (cuda.ok()) {
      std::unique_ptr<Backend> gpu = std::move(cuda).value();
      if (!options.cuda_min_work.none()) {
        gpu = std::make_unique<MinimumWorkBackend>(std::move(gpu),
                                                   options.cuda_min_work);
      }
      backends.push_back(std::move(gpu));
      device = Device::kCuda;
    } else if (options.device == Device::kCuda) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the CUDA backend was asked for but cannot run: ",
          cuda.status().message()));
    } else {
      notes.push_back(absl::StrCat("no GPU backend, running on the CPU: ",
                                   cuda.status().message()));
    }
  }
  if (options.use_onednn) {
    OneDnnBackend::Options backend_options;
    backend_options.max_threads = options.max_threads;
    backend_options.single_thread_below_flops =
        options.single_thread_below_flops;
    backend_options.max_isa = options.max_cpu_isa;
    backend_options.skipped_implementations =
        options.skipped_cpu_implementations;
    absl::StatusOr<std::unique_ptr<OneDnnBackend>> onednn =
        OneDnnBackend::Create(backend_options);
    if (!onednn.ok()) return onednn.status();
    backends.push_back(std::move(onednn).value());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   CreateWithBackends(std::move(backends)));
  engine->notes_ = std::move(notes);
  engine->device_ = device;
  return engine;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithBackends(
    std::vector<std::unique_ptr<Backend>> backends) {
  for (const auto& backend : backends) {
    if (backend == nullptr) {
      return absl::InvalidArgumentError("backends: null backend in the list");
    }
  }
  if (backends.empty() || backends.back()->name() != "reference") {
    backends.push_back(std::make_unique<ReferenceBackend>());
  }
  return std::unique_ptr<Engine>(new Engine(std::move(backends)));
}

std::vector<std::pair<std::string, std::string>> Engine::implementations()
    const {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& backend : backends_) {
    for (std::string& implementation : backend->implementation_names()) {
      std::pair<std::string, std::string> pair(std::move(implementation),
                                               backend->name());
      if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) {
        pairs.push_back(std::move(pair));
      }
    }
  }
  return pairs;
}

std::vector<std::string> Engine::backend_names() const {
  std::vector<std::string> names;
  for (const auto& backend : backends_) names.push_back(backend->name());
  return names;
}

std::vector<std::string> Engine::backend_descriptions() const {
  std::vector<std::string> descriptions;
  for (const auto& backend : backends_) {
    descriptions.push_back(backend->description());
  }
  return descriptions;
}

template <typename Params, typename Method>
absl::Status Engine::Dispatch(const Params& params, Method method,
                              std::initializer_list<TensorView> inputs,
                              OpResult* result,
                              absl::FunctionRef<absl::Status()> late_checks,
                              const bool* outputs_finite) {
  for (const auto& backend : backends_) {
    absl::StatusOr<const char*> ran = ((*backend).*method)(params);
    if (absl::IsUnimplemented(ran.status())) continue;
    if (!ran.ok()) return ran.status();
    // A float32 kernel can overflow where the reference's double does not
    // (scores beyond 3.4e38 from finite inputs). Such rows would come back
    // NaN; they are rare, so only then are the inputs scanned and the call
    // redone on the reference.
    const Backend* ran_on = backend.get();
    const bool kernel_found_finite =
        outputs_finite != nullptr && *outputs_finite;
    if (inputs.size() != 0 && &backend != &backends_.back() &&
        !kernel_found_finite && !AllFinite(*result) && AllFinite(inputs)) {
      RETURN_IF_ERROR(late_checks());
      ran_on = backends_.back().get();
      ASSIGN_OR_RETURN(ran, ((*backends_.back()).*method)(params));
    }
    result->implementation = *ran;
    result->backend = ran_on->name();
    return absl::OkStatus();
  }
  return absl::InternalError("no backend took the request");
}

absl::StatusOr<OpResult> Engine::MaskedSoftmax(
    const MaskedSoftmaxRequest& request) {
  ASSIGN_OR_RETURN(Plan<MaskedSoftmaxParams> plan,
                   ValidateMaskedSoftmax(request));
  OpResult result;
  RETURN_IF_ERROR(AllocateOutputs(&plan, &result));
  RETURN_IF_ERROR(Dispatch(plan.params, &Backend::MaskedSoftmax, {request.x},
                           &result));
  return result;
}

absl::StatusOr<OpResult> Engine::BatchMatmul(const BatchMatmulRequest& request) {
  ASSIGN_OR_RETURN(Plan<BatchMatmulParams> plan, ValidateBatchMatmul(request));
  OpResult result;
  RETURN_IF_ERROR(AllocateOutputs(&plan, &result));
  RETURN_IF_ERROR(Dispatch(plan.params, &Backend::BatchMatmul,
                           // No redo: a float32 product that overflows is
                           // out of float range in double too.
                           {}, &result));
  return result;
}

bool Engine::SpreadsKeysAcrossThreads(const AttentionRequest& request) const {
  const absl::StatusOr<Plan<AttentionParams>> plan =
      ValidateAttentionShapes(request);
  return plan.ok() && backends_.front()->SpreadsKeysAcrossThreads(plan->params);
}

std::optional<HeldMemoryStats> Engine::held_memory_stats() const {
  for (const std::unique_ptr<Backend>& backend : backends_) {
    if (std::optional<HeldMemoryStats> stats = backend->held_memory_stats()) {
      return stats;
    }
  }
  return std::nullopt;
}

absl::StatusOr<OpResult> Engine::ScaledDotProductAttention(
    const AttentionRequest& request) {
  // A reduced precision's range check reads every operand element on this
  // thread, a pass over memory while the kernel's threads wait (a tenth of
  // a large bfloat16 call on AMX). The kernel that rounds the operands may
  // check them as it goes instead (AttentionParams::range_checked); after
  // any call whose kernel did not, and before any redo, the check runs
  // here, and its error is the answer.
  ASSIGN_OR_RETURN(Plan<AttentionParams> plan,
                   ValidateAttentionShapes(request));
  const bool range_matters = plan.params.precision != Precision::kFloat32;
  bool kernel_checked = false;
  if (range_matters) plan.params.range_checked = &kernel_checked;
  // Likewise the scan of the output for overflowed rows.
  bool outputs_finite = false;
  plan.params.outputs_finite = &outputs_finite;
  auto check_range = [&]() -> absl::Status {
    return range_matters && !kernel_checked
               ? CheckAttentionOperandRange(request)
               : absl::OkStatus();
  };
  OpResult result;
  RETURN_IF_ERROR(AllocateOutputs(&plan, &result));
  if (request.return_log_sum_exp) {
    // The output's shape without its last axis: one per query row.
    const Shape rows(plan.output_shape.begin(), plan.output_shape.end() - 1);
    try {
      result.log_sum_exp = Tensor::Uninitialized(rows);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate the log-sum-exp output ", ShapeToString(rows)));
    }
    plan.params.log_sum_exp = result.log_sum_exp.data.data();
  }
  const absl::Status ran =
      Dispatch(plan.params, &Backend::ScaledDotProductAttention,
               {request.queries, request.keys, request.values}, &result,
               check_range, &outputs_finite);
  if (absl::IsOutOfRange(ran)) {
    kernel_checked = false;
    RETURN_IF_ERROR(check_range());
    return absl::InternalError(absl::StrCat(
        "a kernel found an operand past ", PrecisionName(request.precision),
        "'s range that the engine's check did not: ", ran.message()));
  }
  RETURN_IF_ERROR(ran);
  RETURN_IF_ERROR(check_range());
  return result;
}

absl::StatusOr<OpResult> Engine::AdditiveAttention(
    const AdditiveAttentionRequest& request) {
  ASSIGN_OR_RETURN(Plan<AdditiveAttentionParams> plan,
                   ValidateAdditiveAttention(request));
  OpResult result;
  RETURN_IF_ERROR(AllocateOutputs(&plan, &result));
  RETURN_IF_ERROR(Dispatch(plan.params, &Backend::AdditiveAttention,
                           {request.queries, request.keys, request.values,
                            request.w_q, request.w_k, request.w_v},
                           &result));
  return result;
}

absl::StatusOr<OpResult> Engine::NadarayaWatson(
    const NadarayaWatsonRequest& request) {
  ASSIGN_OR_RETURN(Plan<NadarayaWatsonParams> plan,
                   ValidateNadarayaWatson(request));
  OpResult result;
  RETURN_IF_ERROR(AllocateOutputs(&plan, &result));
  RETURN_IF_ERROR(Dispatch(plan.params, &Backend::NadarayaWatson,
                           {request.x_train, request.y_train, request.x_query},
                           &result));
  return result;
}

absl::Status Engine::WarmUp() {
  // Warm-up calls are small, and a work threshold would keep them all off
  // the GPU, whose module loads and first allocations most need paying here:
  // thresholds are lifted while they run.
  std::vector<MinimumWorkBackend*> routed;
  for (const auto& backend : backends_) {
    if (auto* r = dynamic_cast<MinimumWorkBackend*>(backend.get())) {
      routed.push_back(r);
    }
  }
  for (MinimumWorkBackend* r : routed) r->set_take_every_call(true);
  const absl::Status status = RunWarmUpCalls();
  for (MinimumWorkBackend* r : routed) r->set_take_every_call(false);
  return status;
}

absl::Status Engine::RunWarmUpCalls() {
  // The textbook's toy shapes; values only need to be finite.
  Tensor q = Tensor::Zeros({2, 1, 2}), k = Tensor::Zeros({2, 10, 2}),
         v = Tensor::Zeros({2, 10, 4});
  for (size_t i = 0; i < k.data.size(); ++i) k.data[i] = 0.1f * (i % 7);
  const std::vector<int32_t> lengths = {2, 6};
  AttentionRequest attention;
  attention.queries = q.view();
  attention.keys = k.view();
  attention.values = v.view();
  attention.valid_lens = LengthsView{lengths.data(), {2}};
  for (bool weights : {false, true}) {
    attention.return_weights = weights;
    RETURN_IF_ERROR(ScaledDotProductAttention(attention).status());
  }
  // One call per head dim a fused GPU kernel is compiled for, so that its
  // module load and shared-memory setup happen here (microseconds on a CPU).
  for (int64_t d : {32, 64, 128}) {
    const Tensor x = Tensor::Zeros({1, 4, d});
    AttentionRequest fused;
    fused.queries = fused.keys = fused.values = x.view();
    RETURN_IF_ERROR(ScaledDotProductAttention(fused).status());
  }
  MaskedSoftmaxRequest softmax;
  softmax.x = TensorView{k.data.data(), {2, 2, 10}};
  RETURN_IF_ERROR(MaskedSoftmax(softmax).status());
  softmax.valid_lens = LengthsView{lengths.data(), {2}};
  RETURN_IF_ERROR(MaskedSoftmax(softmax).status());
  BatchMatmulRequest matmul;
  matmul.a = k.view();
  matmul.b = v.view();
  matmul.b.shape = {2, 2, 20};
  RETURN_IF_ERROR(BatchMatmul(matmul).status());
  Tensor w = Tensor::Zeros({3, 2}), w_v = Tensor::Zeros({3});
  AdditiveAttentionRequest additive;
  additive.queries = q.view();
  additive.keys = k.view();
  additive.values = v.view();
  additive.w_q = w.view();
  additive.w_k = w.view();
  additive.w_v = w_v.view();
  RETURN_IF_ERROR(AdditiveAttention(additive).status());
  NadarayaWatsonRequest regression;
  regression.x_train = TensorView{k.data.data(), {20}};
  regression.y_train = TensorView{k.data.data(), {20}};
  regression.x_query = TensorView{v.data.data(), {10}};
  return NadarayaWatson(regression).status();
}

absl::StatusOr<FitBandwidthResult> Engine::FitBandwidth(
    const FitBandwidthRequest& request) {
  ASSIGN_OR_RETURN(Plan<NadarayaWatsonParams> plan,
                   ValidateFitBandwidth(request));
  return attn::FitBandwidth(plan.params, request.learning_rate,
                            request.epochs, request.stop_requested);
}

}  // namespace attn
