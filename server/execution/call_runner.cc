#include "server/execution/call_runner.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attn/pieces.h"
#include "attn/status_macros.h"
#include "attn/validate.h"

namespace attnserve {

// One call on its way through the core; shared by the closures that carry it
// (the pool's, the batcher's). Finish() is called exactly once.
class CallRunner::Call {
 public:
  Call(CallRunner* runner, Operation operation, const CallContext& context,
       CallResponder* responder)
      : runner_(runner),
        operation_(operation),
        context_(context),
        responder_(responder),
        received_(absl::Now()) {
    runner_->metrics_->RequestStarted();
  }

  Operation operation() const { return operation_; }
  absl::Time received() const { return received_; }
  CallRecord& record() { return record_; }

  // Admits the decoded call's payload (counted in `budget`) and keeps its
  // ticket for the responder.
  absl::Status Admit(const ElementBudget& budget) {
    if (runner_->admission_ == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(ticket_, runner_->admission_->Admit(
                                  context_.peer, 4 * budget.payload_elements()));
    return absl::OkStatus();
  }

  // Why a queued call's work must not start now, if it must not.
  absl::Status CheckStillWanted(absl::Time started) const {
    if (context_.cancelled && context_.cancelled()) {
      return absl::CancelledError("the call was cancelled while queued");
    }
    if (context_.deadline <= started) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the deadline passed after ",
          absl::FormatDuration(started - received_),
          " in the queue; the work was not started"));
    }
    return absl::OkStatus();
  }

  // Records the kernel step (run or failed) and finishes the call.
  void Complete(absl::Time started, absl::Duration kernel,
                const absl::StatusOr<std::string>& implementation) {
    record_.computed = implementation.ok();
    record_.queue = started - received_;
    record_.compute = kernel;
    if (!implementation.ok()) {
      Finish(implementation.status());
      return;
    }
    record_.implementation = *implementation;
    runner_->metrics_->KernelRun(operation_, *implementation, kernel);
    if (!context_.model.empty()) {
      runner_->metrics_->ModelKernelRun(context_.model, *implementation);
    }
    Finish(responder_->Computed(record_));
  }

  void Finish(const absl::Status& status) {
    const absl::Duration total = absl::Now() - received_;
    runner_->metrics_->RequestFinished(operation_, context_.protocol, status.code(),
                                       total);
    if (!context_.model.empty()) {
      runner_->statistics_.Record(context_.model, status, total,
                                  record_.computed, record_.queue,
                                  record_.compute, record_.batch_requests);
    }
    responder_->Answer(status, record_, std::move(ticket_));
  }

 private:
  CallRunner* const runner_;
  const Operation operation_;
  const CallContext context_;
  CallResponder* const responder_;
  const absl::Time received_;
  CallRecord record_;
  Admission::Ticket ticket_;
};

void ApplyTimeout(int64_t timeout_us, CallContext* context) {
  if (timeout_us <= 0) return;
  context->deadline = std::min(context->deadline,
                               absl::Now() + absl::Microseconds(timeout_us));
}

CallRunner::CallRunner(attn::Engine* engine, WorkerPool* pool,
                       Batcher* batcher, ServiceMetrics* metrics,
                       const ServiceLimits& limits, Admission* admission,
                       bool batch_everything)
    : engine_(engine),
      pool_(pool),
      batcher_(batcher),
      batch_everything_(batch_everything),
      metrics_(metrics),
      limits_(limits),
      admission_(admission) {}

void CallRunner::Refuse(std::optional<Operation> operation,
                        const CallContext& context, const absl::Status& status,
                        CallResponder* responder) {
  metrics_->RequestRefused(operation, context.protocol, status.code());
  responder->Answer(status, CallRecord{}, Admission::Ticket());
}

void CallRunner::Run(Operation operation, const CallContext& context,
                     const Prepare& prepare, CallResponder* responder) {
  auto call = std::make_shared<Call>(this, operation, context, responder);
  // A draining server and a full queue refuse before decoding: under
  // overload, refusals must not take the workers' CPU.
  absl::Status refused =
      admission_ != nullptr ? admission_->CheckAccepting() : absl::OkStatus();
  if (refused.ok()) refused = pool_->CheckRoom();
  if (!refused.ok()) {
    call->Finish(refused);
    return;
  }
  ElementBudget budget(limits_.max_request_elements);
  absl::StatusOr<Work> work = prepare(&budget);
  if (work.ok()) {
    if (absl::Status admitted = call->Admit(budget); !admitted.ok()) {
      work = admitted;
    }
  }
  if (!work.ok()) {
    call->Finish(work.status());
    return;
  }
  const absl::Status scheduled = pool_->Schedule(
      [this, call, work = *std::move(work)] {
        const absl::Time started = absl::Now();
        metrics_->QueueWait(call->operation(), started - call->received());
        if (absl::Status wanted = call->CheckStillWanted(started);
            !wanted.ok()) {
          call->Finish(wanted);
          return;
        }
        const absl::StatusOr<std::string> implementation = work();
        call->Complete(started, absl::Now() - started, implementation);
      },
      context.priority);
  if (!scheduled.ok()) call->Finish(scheduled);
}

absl::StatusOr<attn::OpResult> RunAlone(attn::Engine& engine,
                                        const OperationRequest& request) {
  struct Visitor {
    attn::Engine& engine;
    absl::StatusOr<attn::OpResult> operator()(
        const attn::MaskedSoftmaxRequest& r) {
      return engine.MaskedSoftmax(r);
    }
    absl::StatusOr<attn::OpResult> operator()(
        const attn::BatchMatmulRequest& r) {
      return engine.BatchMatmul(r);
    }
    absl::StatusOr<attn::OpResult> operator()(const attn::AttentionRequest& r) {
      return engine.ScaledDotProductAttention(r);
    }
    absl::StatusOr<attn::OpResult> operator()(
        const attn::AdditiveAttentionRequest& r) {
      return engine.AdditiveAttention(r);
    }
    absl::StatusOr<attn::OpResult> operator()(
        const attn::NadarayaWatsonRequest& r) {
      return engine.NadarayaWatson(r);
    }
    // The library's rows, in the call's own shapes.
    absl::StatusOr<attn::OpResult> operator()(const StoredRequest& r) {
      absl::StatusOr<attn::OpResult> result =
          r.pieces.empty() ? std::visit(*this, r.request)
                           : attn::AttendInPieces(engine, r.pieces);
      if (!result.ok()) return result;
      result->output.shape = r.output_shape;
      if (!result->weights.empty()) result->weights.shape = r.weights_shape;
      return result;
    }
  };
  return std::visit(Visitor{engine}, request);
}

void CallRunner::RunOp(Operation operation, const CallContext& context,
                       const DecodeOp& decode, EncodeOp encode,
                       WireNames wire_names, CallResponder* responder) {
  if (!wire_names) wire_names = [](absl::Status status) { return status; };
  // Decodes, checks the request's shapes and that its result fits.
  auto prepare = [this, &decode, &wire_names](
                     ElementBudget* budget) -> absl::StatusOr<OperationRequest> {
    ASSIGN_OR_RETURN(OperationRequest op, decode(budget));
    absl::StatusOr<attn::ResultSize> size = ResultSizeOf(op);
    if (!size.ok()) return wire_names(size.status());
    RETURN_IF_ERROR(CheckResultFits(size, budget));
    return op;
  };
  if (batcher_ == nullptr ||
      (!batch_everything_ && !context.gains_from_batching)) {
    Run(operation, context,
        [this, &prepare, encode, wire_names](
            ElementBudget* budget) -> absl::StatusOr<Work> {
          ASSIGN_OR_RETURN(OperationRequest op, prepare(budget));
          return Work([this, op = std::move(op), encode,
                       wire_names]() -> absl::StatusOr<std::string> {
            absl::StatusOr<attn::OpResult> result = RunAlone(*engine_, op);
            if (!result.ok()) return wire_names(result.status());
            encode(*result);
            return result->implementation;
          });
        },
        responder);
    return;
  }
  auto call = std::make_shared<Call>(this, operation, context, responder);
  // As in Run: a draining server and a full queue refuse before decoding.
  absl::Status refused =
      admission_ != nullptr ? admission_->CheckAccepting() : absl::OkStatus();
  if (refused.ok()) refused = batcher_->CheckRoom();
  if (!refused.ok()) {
    call->Finish(refused);
    return;
  }
  ElementBudget budget(limits_.max_request_elements);
  absl::StatusOr<OperationRequest> op = prepare(&budget);
  if (op.ok()) {
    if (absl::Status admitted = call->Admit(budget); !admitted.ok()) {
      op = admitted;
    }
  }
  if (!op.ok()) {
    call->Finish(op.status());
    return;
  }
  auto task = std::make_unique<Batcher::Task>();
  task->request = *std::move(op);
  task->deadline = context.deadline;
  task->cancelled = context.cancelled;
  task->priority = context.priority;
  task->done = [this, call, encode = std::move(encode), wire_names](
                   absl::StatusOr<attn::OpResult> result,
                   const BatchTiming& timing) {
    call->record().batch_requests = std::max(timing.batch_requests, 1);
    metrics_->QueueWait(call->operation(), timing.started - call->received());
    absl::StatusOr<std::string> implementation =
        result.ok() ? absl::StatusOr<std::string>(result->implementation)
                    : absl::StatusOr<std::string>(wire_names(result.status()));
    if (result.ok()) encode(*result);
    call->Complete(timing.started, timing.kernel, implementation);
  };
  absl::Status scheduled = batcher_->Schedule(std::move(task));
  if (!scheduled.ok()) call->Finish(wire_names(std::move(scheduled)));
}

absl::Status CallRunner::CheckResultFits(
    const absl::StatusOr<attn::ResultSize>& size, ElementBudget* budget) const {
  if (!size.ok()) return absl::OkStatus();
  budget->CountResult(size->elements);
  const int64_t bytes = size->elements * int64_t{4};
  if (bytes <= limits_.max_response_bytes) return absl::OkStatus();
  std::string what =
      absl::StrCat("output ", attn::ShapeToString(size->output_shape));
  if (!size->weights_shape.empty()) {
    absl::StrAppend(&what, " and weights ",
                    attn::ShapeToString(size->weights_shape));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the result (", what, ") would take at least ", bytes,
      " bytes, over the response limit of ", limits_.max_response_bytes,
      " (--max_message_bytes); it was not computed: ask for less (smaller "
      "shapes, no weights)"));
}

}  // namespace attnserve
