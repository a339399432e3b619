// The service's Prometheus metrics: one object owns the registry, builds
// every family and binds every label set at start-up, and hands the hot path
// cached references, so serving a request only increments and observes.
//
// Families (histograms, not summaries, so that replicas aggregate):
//   attnserve_requests_total{rpc, code, protocol}  counter; rpc="unresolved"
//     for calls answered before a model or operation was resolved
//   attnserve_request_duration_seconds{rpc, protocol}  whole call, histogram
//     (protocol: grpc, http; the other families do not say)
//   attnserve_queue_wait_seconds{rpc}              waiting for a worker
//   attnserve_kernel_duration_seconds{rpc, backend}  the kernel alone
//   attnserve_kernel_runs_total{rpc, implementation}  which implementation
//                                                  ran (the CPU's
//                                                  cpu-fused-blocks,
//                                                  cpu-lane, ...)
//   attnserve_batch_size{rpc}                      requests per batch
//   attnserve_batch_computed_elements_total{rpc}   score elements computed
//   attnserve_batch_padding_elements_total{rpc}    ... of which padding
//   attnserve_rejected_requests_total{rpc, reason} resource_exhausted,
//                                                  deadline, cancelled,
//                                                  shutting_down
//   attnserve_unauthenticated_requests_total{reason}  missing_token,
//                                                  invalid_token
//   attnserve_model_events_total{event, outcome}   the served models' changes:
//                                                  event load, replace,
//                                                  unload, save; outcome ok,
//                                                  refused
//   attnserve_inflight_requests                    gauge
//   attnserve_queue_depth                          gauge (sampled at scrape)
//   attnserve_inflight_bytes                       gauge (sampled at scrape):
//                                                  payload bytes of admitted
//                                                  calls not yet sent
//   attnserve_connections_refused_total            counter (sampled): closed
//                                                  at accept to keep
//                                                  --fd_reserve fds free
//   process_cpu_seconds_total, process_resident_memory_bytes,
//   process_virtual_memory_bytes, process_open_fds, process_max_fds,
//   process_start_time_seconds
//
// Thread-safe: prometheus-cpp's metrics are atomic; the maps are immutable
// after Create.
#ifndef ATTNSERVE_SERVER_EXECUTION_METRICS_H_
#define ATTNSERVE_SERVER_EXECUTION_METRICS_H_

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attn/held_memory.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/execution/operation.h"

namespace attnserve {

class ServiceMetrics {
 public:
  // `implementations`: every (implementation, backend) pair a result may
  // name (attn::Engine::implementations()); an implementation not listed is
  // counted under "other". INTERNAL if prometheus-cpp rejects a family (a
  // bug: fail at boot, never on a request).
  using Implementations = std::vector<std::pair<std::string, std::string>>;
  static absl::StatusOr<std::unique_ptr<ServiceMetrics>> Create(
      const Implementations& implementations);

  // Both are registered with the exposer.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::shared_ptr<prometheus::Collectable> sampled() const;

  // Sample the queue depth and the payload bytes of admitted calls
  // (server/execution/admission.h) on every scrape. Call before serving.
  void SetQueueDepthSource(std::function<int()> source);
  void SetInflightBytesSource(std::function<int64_t()> source);
  // What a stored model that grows holds, sampled on every scrape: its
  // rows, the files they are in, and the rows evicted since its last whole
  // save or compaction.
  struct StoredRows {
    std::string model;
    int64_t rows = 0;
    int64_t files = 0;
    int64_t evicted_rows = 0;
    int64_t pieces = 0;
  };
  void SetStoredRowsSource(std::function<std::vector<StoredRows>()> source);
  // An append (`evict` false) or an eviction of `model` that succeeded,
  // and how long it took (an append: until its rows were durable and
  // served).
  void RowsChanged(const std::string& model, bool evict,
                   absl::Duration took);
  // A compaction of `model` that folded its rows files into a new base.
  void Compacted(const std::string& model);
  // Samples what the GPU holds of stored memories on every scrape
  // (attn::Engine::held_memory_stats; no families when it has none).
  void SetHeldMemorySource(
      std::function<std::optional<attn::HeldMemoryStats>()> source);

  void RequestStarted();
  void RequestFinished(Operation operation, Protocol protocol, absl::StatusCode code,
                       absl::Duration total);
  void QueueWait(Operation operation, absl::Duration wait);
  void KernelRun(Operation operation, const std::string& implementation,
                 absl::Duration kernel);
  // One executed batch: its size in requests, and its computed and useful
  // score elements (the difference is padding).
  void BatchExecuted(Operation operation, int requests, int64_t computed_elements,
                     int64_t useful_elements);
  // A call answered before it reached the core: its request named no
  // model or operation that could be resolved (an unknown model, a
  // malformed body, an unknown route: `operation` empty, counted under
  // rpc="unresolved"), or its operation's call was refused before it was
  // handed over (bad metadata, a request of the wrong structure). Counted
  // in attnserve_requests_total alone: it was never in flight, queued or
  // computed.
  void RequestRefused(std::optional<Operation> operation, Protocol protocol,
                      absl::StatusCode code);
  // A call refused by token authentication (server/transport/auth.h).
  void Unauthenticated(bool token_missing);
  // A change to the served models, or a refused attempt at one: `event` is
  // one of kModelEvents (another is not counted).
  static constexpr std::array<const char*, 7> kModelEvents = {
      "load", "replace", "unload", "save", "append", "evict", "compact"};
  void ModelEvent(const std::string& event, bool refused);
  // One computed call of the model named `model` (a stored memory's, or a
  // built-in model's), counted by the backend of the implementation that
  // ran it, so a memory's calls show which ran on the GPU and which on the
  // CPU.
  void ModelKernelRun(const std::string& model,
                      const std::string& implementation);

 private:
  struct PerOperation {
    std::array<std::array<prometheus::Counter*, 17>, kProtocolCount>
        requests_by_code{};
    std::array<prometheus::Histogram*, kProtocolCount> duration{};
    prometheus::Histogram* queue_wait = nullptr;
    // By the implementation that ran: its backend's histogram, its own
    // counter; "other" for a name not known at start-up.
    absl::flat_hash_map<std::string, prometheus::Histogram*> kernel;
    prometheus::Histogram* kernel_other = nullptr;
    absl::flat_hash_map<std::string, prometheus::Counter*> runs;
    prometheus::Counter* runs_other = nullptr;
    prometheus::Histogram* batch_size = nullptr;
    prometheus::Counter* batch_computed = nullptr;
    prometheus::Counter* batch_padding = nullptr;
    // Rejections by reason: full queue or limits, deadline in the queue,
    // cancelled, shutting down.
    prometheus::Counter* rejected_resource_exhausted = nullptr;
    prometheus::Counter* rejected_deadline = nullptr;
    prometheus::Counter* rejected_cancelled = nullptr;
    prometheus::Counter* rejected_unavailable = nullptr;
  };

  ServiceMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::array<PerOperation, kOperationCount> per_operation_;
  std::array<std::array<prometheus::Counter*, 17>, kProtocolCount>
      unresolved_by_code_{};
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Counter* unauthenticated_missing_ = nullptr;
  prometheus::Counter* unauthenticated_invalid_ = nullptr;
  // By kModelEvents' index: [0] ok, [1] refused.
  std::array<std::array<prometheus::Counter*, 2>, kModelEvents.size()>
      model_events_{};
  std::shared_ptr<prometheus::Collectable> sampled_;  // queue depth, process
  // Per stored model: appends, evictions, append latency (labels made as
  // models first change).
  prometheus::Family<prometheus::Counter>* appends_ = nullptr;
  prometheus::Family<prometheus::Counter>* evictions_ = nullptr;
  prometheus::Family<prometheus::Counter>* compactions_ = nullptr;
  prometheus::Family<prometheus::Histogram>* append_seconds_ = nullptr;
  // Implementation -> its backend, and the per-model counters made so far.
  absl::flat_hash_map<std::string, std::string> backend_of_;
  prometheus::Family<prometheus::Counter>* model_runs_ = nullptr;
  absl::Mutex model_runs_mutex_;
  absl::flat_hash_map<std::pair<std::string, std::string>, prometheus::Counter*>
      model_run_counters_ ABSL_GUARDED_BY(model_runs_mutex_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_METRICS_H_
