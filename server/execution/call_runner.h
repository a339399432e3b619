// A call through the execution stack: the one way from decoded to answered,
// whatever API it came by. Front ends (server/typed/: the typed attention.v1
// service; server/kserve/: KServe v2 over gRPC and REST) only decode, hand
// over and encode.
//
// A call enters Run() (or RunOp(), which can batch) with its context
// (peer, deadline, cancellation, the model it counts for), a Prepare step
// that decodes and checks the request on the calling thread and returns the
// Work that computes and encodes it, and a CallResponder that answers. The
// core, in order:
// - refuses a draining server (UNAVAILABLE) and a full queue
//   (RESOURCE_EXHAUSTED), before decoding;
// - runs Prepare; admits the call's payload (request and result elements,
//   server/execution/admission.h);
// - queues the Work on the WorkerPool, or an operation's request on the
//   Batcher when there is one: this is where a request waits and where it
//   is batched (server/execution/batchable.h says what batches with what);
// - skips the Work of a call cancelled, or past its deadline, in the queue
//   (CANCELLED / DEADLINE_EXCEEDED), else runs it on a worker: this is where
//   it is computed;
// - records metrics and the model's statistics, and calls the responder:
//   Computed() after the Work succeeded (the front end may still refuse its
//   encoded response), then Answer() exactly once, handing over the call's
//   admission ticket, which the front end holds until its response is sent.
//
// Thread-safe; borrows the engine, pool, batcher, metrics and admission,
// which must outlive it and every call it runs.
#ifndef ATTNSERVE_SERVER_EXECUTION_CALL_RUNNER_H_
#define ATTNSERVE_SERVER_EXECUTION_CALL_RUNNER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attn/engine.h"
#include "attn/validate.h"
#include "server/execution/admission.h"
#include "server/execution/batchable.h"
#include "server/execution/batcher.h"
#include "server/execution/element_budget.h"
#include "server/execution/metrics.h"
#include "server/execution/model_statistics.h"
#include "server/execution/worker_pool.h"

namespace attnserve {

struct ServiceLimits {
  // Elements of all input tensors of one request together.
  int64_t max_request_elements = int64_t{1} << 26;
  // The largest response message; a larger result is answered with
  // RESOURCE_EXHAUSTED naming the limit (gRPC would fail the send anyway).
  int64_t max_response_bytes = int64_t{256} << 20;
};

// A call as the core sees it, whatever its protocol.
struct CallContext {
  std::string peer;  // its connection: admission's per-connection share
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // may be empty: never cancelled
  std::string model;  // counted in ModelStatistics under it; empty: not
  // The queues' order (server/execution/worker_pool.h, batcher.h): 1 first,
  // then 2, ...; 0 (none given) after every explicit level.
  uint64_t priority = 0;
  Protocol protocol = Protocol::kGrpc;  // the metrics' `protocol` label
  // The call gains from batching whatever else runs (its model's kind says
  // so: a batch reads the stored version once for all of them), so it is
  // batched even where only such calls are (CallRunner's batch_everything
  // false).
  bool gains_from_batching = false;
};

// Applies a per-request timeout (Triton's, in microseconds; 0: none): a call
// still queued when it runs out is answered DEADLINE_EXCEEDED without being
// computed. Shortens the deadline only.
void ApplyTimeout(int64_t timeout_us, CallContext* context);

// What one call came to.
struct CallRecord {
  bool computed = false;  // the kernel ran
  std::string implementation;  // which backend ran it, when computed
  absl::Duration queue = absl::ZeroDuration();    // waiting for the kernel
  absl::Duration compute = absl::ZeroDuration();  // the kernel, encoding
  int batch_requests = 1;  // requests computed together with this one
};

// How the core answers a call; implemented by each front end per call.
class CallResponder {
 public:
  virtual ~CallResponder() = default;
  // The Work succeeded and filled the front end's response. Returns the
  // status to answer with: OK, or why the encoded response cannot be sent
  // (e.g. RESOURCE_EXHAUSTED over the response size limit).
  virtual absl::Status Computed(const CallRecord& record) = 0;
  // Answers with `status` and ends the call; called exactly once, last.
  // Keep `ticket` (the call's admitted bytes) until the answer is sent.
  virtual void Answer(const absl::Status& status, const CallRecord& record,
                      Admission::Ticket ticket) = 0;
};

// Runs `request` alone on `engine`, as one library call: what a call that is
// not batched runs, and a batch member that cannot share its batch's call.
// Blocks while the engine computes; thread-safe.
absl::StatusOr<attn::OpResult> RunAlone(attn::Engine& engine,
                                        const OperationRequest& request);

class CallRunner {
 public:
  // The kernel step of one call, run on a worker: computes, fills the
  // response and returns the name of the implementation that ran.
  using Work = std::function<absl::StatusOr<std::string>()>;
  // The decode step, run on the calling thread: checks the request,
  // counting its elements in the budget, and returns the Work.
  using Prepare = std::function<absl::StatusOr<Work>(ElementBudget*)>;
  // The decode step of an operation's call, and the encoding of its result
  // (run on a worker).
  using DecodeOp =
      std::function<absl::StatusOr<OperationRequest>(ElementBudget*)>;
  using EncodeOp = std::function<void(const attn::OpResult&)>;
  // Puts the API's names into the library's errors (e.g. "a: ..." becomes
  // "input 'X' ..."); may be empty.
  using WireNames = std::function<absl::Status(absl::Status)>;

  // `batcher` may be null: attention calls then run alone like the others.
  // `admission` may be null: every decoded call is admitted (no bound on
  // bytes in flight, no drain). Without `batch_everything`, only calls that
  // gain from batching (CallContext::gains_from_batching) go through the
  // batcher.
  CallRunner(attn::Engine* engine, WorkerPool* pool, Batcher* batcher,
             ServiceMetrics* metrics, const ServiceLimits& limits,
             Admission* admission = nullptr, bool batch_everything = true);

  // Runs one call (see the file comment); `responder` must live until its
  // Answer has been called (which may happen before Run returns).
  void Run(Operation operation, const CallContext& context, const Prepare& prepare,
           CallResponder* responder);
  // Runs one call of a batchable operation: through the batcher when there
  // is one, else like Run. An invalid request is answered before it
  // queues, in the API's names.
  void RunOp(Operation operation, const CallContext& context, const DecodeOp& decode,
             EncodeOp encode, WireNames wire_names, CallResponder* responder);

  // Answers a call that a front end refuses before it hands the call over
  // (ServiceMetrics::RequestRefused: `operation` empty when no model or
  // operation could be resolved): counts it, then `responder` answers
  // `status` at once.
  void Refuse(std::optional<Operation> operation, const CallContext& context,
              const absl::Status& status, CallResponder* responder);

  // Refuses, before anything is allocated or computed, a request whose
  // result could not be sent: RESOURCE_EXHAUSTED naming the result's shape,
  // its size and --max_message_bytes. (4 bytes per element is the least any
  // encoding takes.) OK for an invalid request: the kernel step reports
  // that, in the words of its API. Counts the result in `budget`.
  absl::Status CheckResultFits(const absl::StatusOr<attn::ResultSize>& size,
                               ElementBudget* budget) const;

  attn::Engine* engine() const { return engine_; }
  const ServiceLimits& limits() const { return limits_; }
  const ModelStatistics& statistics() const { return statistics_; }

 private:
  class Call;

  attn::Engine* const engine_;
  WorkerPool* const pool_;
  Batcher* const batcher_;
  const bool batch_everything_;
  ServiceMetrics* const metrics_;
  const ServiceLimits limits_;
  Admission* const admission_;
  ModelStatistics statistics_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_CALL_RUNNER_H_
