#include "server/execution/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/process/accept_guard.h"

namespace attnserve {
namespace {

// From 25 microseconds (a toy call's kernel) to 10 seconds.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const buckets = new prometheus::Histogram::BucketBoundaries{
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
      25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
  return *buckets;
}

const char* CodeName(int code) {
  static const char* const kNames[17] = {
      "OK",           "CANCELLED",          "UNKNOWN",
      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS",   "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED",        "OUT_OF_RANGE",
      "UNIMPLEMENTED",    "INTERNAL",          "UNAVAILABLE",
      "DATA_LOSS",        "UNAUTHENTICATED"};
  return kNames[code];
}

prometheus::MetricFamily Single(const std::string& name,
                                const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {metric}};
}

// Values read at scrape time: the work queue's depth and the process basics
// from /proc (prometheus-cpp has no process collector).
class SampledCollector : public prometheus::Collectable {
 public:
  void SetQueueDepthSource(std::function<int()> source) {
    queue_depth_ = std::move(source);
  }
  void SetInflightBytesSource(std::function<int64_t()> source) {
    inflight_bytes_ = std::move(source);
  }
  void SetHeldMemorySource(
      std::function<std::optional<attn::HeldMemoryStats>()> source) {
    held_memory_ = std::move(source);
  }
  void SetStoredRowsSource(
      std::function<std::vector<ServiceMetrics::StoredRows>()> source) {
    stored_rows_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    families.push_back(Single(
        "attnserve_queue_depth", "Requests waiting for a worker thread.",
        prometheus::MetricType::Gauge, queue_depth_ ? queue_depth_() : 0));
    families.push_back(Single(
        "attnserve_inflight_bytes",
        "Request and response payload bytes of admitted calls whose "
        "responses are not yet sent (--max_inflight_bytes bounds it).",
        prometheus::MetricType::Gauge,
        inflight_bytes_ ? static_cast<double>(inflight_bytes_()) : 0));
    if (const std::optional<attn::HeldMemoryStats> held =
            held_memory_ ? held_memory_() : std::nullopt) {
      const auto gauge = prometheus::MetricType::Gauge;
      const auto counter = prometheus::MetricType::Counter;
      families.push_back(Single(
          "attnserve_device_memory_held_bytes",
          "Device memory holding stored memories' keys and values on the GPU.",
          gauge, static_cast<double>(held->bytes_held)));
      families.push_back(Single(
          "attnserve_device_memory_budget_bytes",
          "The most device memory stored memories may hold "
          "(--cuda_held_memory_bytes).",
          gauge, static_cast<double>(held->budget_bytes)));
      families.push_back(Single("attnserve_device_memories_held",
                                "Stored memories held on the GPU now.", gauge,
                                static_cast<double>(held->memories_held)));
      families.push_back(Single(
          "attnserve_device_memory_placements_total",
          "Stored memories copied to the GPU (at a first call, or back "
          "after an eviction).",
          counter, static_cast<double>(held->placements)));
      families.push_back(Single(
          "attnserve_device_memory_evictions_total",
          "Stored memories dropped from the GPU for room, least recently "
          "used first.",
          counter, static_cast<double>(held->evictions)));
      families.push_back(Single(
          "attnserve_device_memory_refusals_total",
          "Calls on a stored memory that ran on the CPU because the GPU "
          "had no room for it.",
          counter, static_cast<double>(held->refusals)));
    }
    if (stored_rows_) {
      const std::vector<ServiceMetrics::StoredRows> models = stored_rows_();
      struct Gauge {
        const char* name;
        const char* help;
        int64_t ServiceMetrics::StoredRows::*value;
      };
      for (const Gauge& gauge :
           {Gauge{"attnserve_model_rows",
                  "Rows (key-value pairs, training points) a stored model "
                  "that grows holds now.",
                  &ServiceMetrics::StoredRows::rows},
            Gauge{"attnserve_model_files",
                  "Files a stored model's rows are in: weights.safetensors "
                  "or its compacted base, and a rows file per append since "
                  "then.",
                  &ServiceMetrics::StoredRows::files},
            Gauge{"attnserve_model_evicted_rows",
                  "Rows evicted from a stored model since its last whole "
                  "save or compaction (still in its files).",
                  &ServiceMetrics::StoredRows::evicted_rows},
            Gauge{"attnserve_model_pieces",
                  "Pieces a stored model's rows are served from, each "
                  "attended on its own and merged: 1, or 2 for a grown "
                  "memory (its base file's rows where they are mapped, and "
                  "the rows appended since).",
                  &ServiceMetrics::StoredRows::pieces}}) {
        prometheus::MetricFamily family{gauge.name, gauge.help,
                                        prometheus::MetricType::Gauge, {}};
        for (const ServiceMetrics::StoredRows& model : models) {
          prometheus::ClientMetric metric;
          metric.label.push_back({"model", model.model});
          metric.gauge.value = static_cast<double>(model.*gauge.value);
          family.metric.push_back(std::move(metric));
        }
        families.push_back(std::move(family));
      }
    }
    const long ticks = sysconf(_SC_CLK_TCK);
    const long page = sysconf(_SC_PAGESIZE);
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)),
                     std::istreambuf_iterator<char>());
    // Fields after the parenthesised command name, which may hold spaces.
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && ticks > 0) {
      std::istringstream rest(stat.substr(close + 2));
      std::vector<std::string> fields;
      for (std::string field; rest >> field;) fields.push_back(field);
      // state is field 3 of stat(5); here index 0. utime 14, stime 15,
      // starttime 22, vsize 23, rss 24.
      if (fields.size() > 21) {
        const double cpu =
            (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
        families.push_back(Single("process_cpu_seconds_total",
                                  "User and system CPU time spent in seconds.",
                                  prometheus::MetricType::Counter, cpu));
        families.push_back(Single("process_virtual_memory_bytes",
                                  "Virtual memory size in bytes.",
                                  prometheus::MetricType::Gauge,
                                  std::stod(fields[20])));
        families.push_back(Single("process_resident_memory_bytes",
                                  "Resident memory size in bytes.",
                                  prometheus::MetricType::Gauge,
                                  std::stod(fields[21]) * page));
        families.push_back(Single(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds.",
            prometheus::MetricType::Gauge,
            BootTimeSeconds() + std::stod(fields[19]) / ticks));
      }
    }
    families.push_back(Single("process_open_fds",
                              "Number of open file descriptors.",
                              prometheus::MetricType::Gauge, OpenFds()));
    if (rlimit limits{}; getrlimit(RLIMIT_NOFILE, &limits) == 0) {
      families.push_back(Single(
          "process_max_fds", "Maximum number of open file descriptors.",
          prometheus::MetricType::Gauge, static_cast<double>(limits.rlim_cur)));
    }
    families.push_back(Single(
        "attnserve_connections_refused_total",
        "Connections closed at accept because fewer than --fd_reserve file "
        "descriptors would have stayed free, or the HTTP port already had "
        "--http_max_connections.",
        prometheus::MetricType::Counter,
        static_cast<double>(ConnectionsRefusedByAcceptGuard())));
    return families;
  }

 private:
  static double BootTimeSeconds() {
    std::ifstream file("/proc/stat");
    for (std::string key; file >> key;) {
      if (key == "btime") {
        double value = 0;
        file >> value;
        return value;
      }
    }
    return 0;
  }

  static double OpenFds() {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return 0;
    int count = 0;
    while (readdir(dir) != nullptr) ++count;
    closedir(dir);
    return count - 3;  // ".", "..", and the directory's own descriptor
  }

  std::function<int()> queue_depth_;
  std::function<int64_t()> inflight_bytes_;
  std::function<std::optional<attn::HeldMemoryStats>()> held_memory_;
  std::function<std::vector<ServiceMetrics::StoredRows>()> stored_rows_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceMetrics>> ServiceMetrics::Create(
    const Implementations& implementations) {
  std::unique_ptr<ServiceMetrics> metrics(new ServiceMetrics());
  try {
    metrics->registry_ = std::make_shared<prometheus::Registry>();
    prometheus::Registry& registry = *metrics->registry_;
    auto& requests = prometheus::BuildCounter()
                         .Name("attnserve_requests_total")
                         .Help("Finished requests by RPC, gRPC status code and "
                               "protocol (grpc, http).")
                         .Register(registry);
    auto& duration =
        prometheus::BuildHistogram()
            .Name("attnserve_request_duration_seconds")
            .Help("Whole-call latency: from the handler to Finish.")
            .Register(registry);
    auto& queue_wait =
        prometheus::BuildHistogram()
            .Name("attnserve_queue_wait_seconds")
            .Help("Time a request waited for a worker thread.")
            .Register(registry);
    auto& kernel = prometheus::BuildHistogram()
                       .Name("attnserve_kernel_duration_seconds")
                       .Help("Time spent in the kernel library alone, by "
                             "the backend that ran.")
                       .Register(registry);
    auto& runs = prometheus::BuildCounter()
                     .Name("attnserve_kernel_runs_total")
                     .Help("Kernel calls by RPC and the implementation that ran.")
                     .Register(registry);
    auto& batch_size = prometheus::BuildHistogram()
                           .Name("attnserve_batch_size")
                           .Help("Requests computed together in one batch.")
                           .Register(registry);
    auto& batch_computed =
        prometheus::BuildCounter()
            .Name("attnserve_batch_computed_elements_total")
            .Help("Score-matrix elements of executed batches, padding "
                  "included.")
            .Register(registry);
    auto& batch_padding =
        prometheus::BuildCounter()
            .Name("attnserve_batch_padding_elements_total")
            .Help("Score-matrix elements of executed batches that were "
                  "padding (waste = padding / computed).")
            .Register(registry);
    auto& rejected = prometheus::BuildCounter()
                         .Name("attnserve_rejected_requests_total")
                         .Help("Requests refused or dropped unserved, by "
                               "reason.")
                         .Register(registry);
    auto& unauthenticated =
        prometheus::BuildCounter()
            .Name("attnserve_unauthenticated_requests_total")
            .Help("Calls refused UNAUTHENTICATED (--auth_tokens_file), by "
                  "reason; the RPC is not known at that point.")
            .Register(registry);
    metrics->unauthenticated_missing_ =
        &unauthenticated.Add({{"reason", "missing_token"}});
    metrics->unauthenticated_invalid_ =
        &unauthenticated.Add({{"reason", "invalid_token"}});
    auto& model_events =
        prometheus::BuildCounter()
            .Name("attnserve_model_events_total")
            .Help("Changes to the served models (load, replace: a load, "
                  "upload or save over a served model, unload, save, "
                  "append: rows added to a stored model, evict: its oldest "
                  "rows dropped, compact: its rows files folded into one), "
                  "and refused or failed attempts at one, by outcome.")
            .Register(registry);
    for (size_t e = 0; e < kModelEvents.size(); ++e) {
      metrics->model_events_[e][0] =
          &model_events.Add({{"event", kModelEvents[e]}, {"outcome", "ok"}});
      metrics->model_events_[e][1] = &model_events.Add(
          {{"event", kModelEvents[e]}, {"outcome", "refused"}});
    }
    metrics->appends_ =
        &prometheus::BuildCounter()
             .Name("attnserve_model_appends_total")
             .Help("Appends to each stored model that succeeded (rows "
                   "durable and served).")
             .Register(registry);
    metrics->evictions_ =
        &prometheus::BuildCounter()
             .Name("attnserve_model_evictions_total")
             .Help("Evictions of each stored model's oldest rows that "
                   "succeeded (those of a max_rows window, which come with "
                   "appends, are not counted).")
             .Register(registry);
    metrics->compactions_ =
        &prometheus::BuildCounter()
             .Name("attnserve_model_compactions_total")
             .Help("Compactions of each stored model that folded its rows "
                   "files and eviction records into a new base file.")
             .Register(registry);
    metrics->append_seconds_ =
        &prometheus::BuildHistogram()
             .Name("attnserve_model_append_seconds")
             .Help("Time of each append that succeeded, from its rows "
                   "checked to them durable and served, by stored model.")
             .Register(registry);
    metrics->model_runs_ =
        &prometheus::BuildCounter()
             .Name("attnserve_model_kernel_runs_total")
             .Help("Computed calls of each model, by name and by the "
                   "backend that ran them (cuda, onednn-cpu, reference).")
             .Register(registry);
    for (const auto& [implementation, backend] : implementations) {
      metrics->backend_of_[implementation] = backend;
    }
    auto& inflight = prometheus::BuildGauge()
                         .Name("attnserve_inflight_requests")
                         .Help("Requests received and not yet finished.")
                         .Register(registry);
    metrics->inflight_ = &inflight.Add({});
    for (int p = 0; p < kProtocolCount; ++p) {
      for (int code = 0; code < 17; ++code) {
        metrics->unresolved_by_code_[p][code] = &requests.Add(
            {{"rpc", "unresolved"},
             {"code", CodeName(code)},
             {"protocol", ProtocolName(static_cast<Protocol>(p))}});
      }
    }
    for (int r = 0; r < kOperationCount; ++r) {
      const std::string operation = OperationName(static_cast<Operation>(r));
      PerOperation& per_operation = metrics->per_operation_[r];
      for (int p = 0; p < kProtocolCount; ++p) {
        const std::string protocol = ProtocolName(static_cast<Protocol>(p));
        for (int code = 0; code < 17; ++code) {
          per_operation.requests_by_code[p][code] = &requests.Add(
              {{"rpc", operation}, {"code", CodeName(code)}, {"protocol", protocol}});
        }
        per_operation.duration[p] = &duration.Add(
            {{"rpc", operation}, {"protocol", protocol}}, LatencyBuckets());
      }
      per_operation.queue_wait = &queue_wait.Add({{"rpc", operation}}, LatencyBuckets());
      for (const auto& [implementation, backend] : implementations) {
        per_operation.kernel[implementation] = &kernel.Add(
            {{"rpc", operation}, {"backend", backend}}, LatencyBuckets());
        per_operation.runs[implementation] =
            &runs.Add({{"rpc", operation}, {"implementation", implementation}});
      }
      per_operation.runs_other =
          &runs.Add({{"rpc", operation}, {"implementation", "other"}});
      per_operation.kernel_other = &kernel.Add(
          {{"rpc", operation}, {"backend", "other"}}, LatencyBuckets());
      per_operation.batch_size = &batch_size.Add(
          {{"rpc", operation}}, prometheus::Histogram::BucketBoundaries{
                              1, 2, 4, 8, 16, 32, 64, 128});
      per_operation.batch_computed = &batch_computed.Add({{"rpc", operation}});
      per_operation.batch_padding = &batch_padding.Add({{"rpc", operation}});
      per_operation.rejected_resource_exhausted =
          &rejected.Add({{"rpc", operation}, {"reason", "resource_exhausted"}});
      per_operation.rejected_deadline =
          &rejected.Add({{"rpc", operation}, {"reason", "deadline"}});
      per_operation.rejected_cancelled =
          &rejected.Add({{"rpc", operation}, {"reason", "cancelled"}});
      per_operation.rejected_unavailable =
          &rejected.Add({{"rpc", operation}, {"reason", "shutting_down"}});
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("building the metric families: ", e.what()));
  }
  metrics->sampled_ = std::make_shared<SampledCollector>();
  return metrics;
}

void ServiceMetrics::Unauthenticated(bool token_missing) {
  (token_missing ? unauthenticated_missing_ : unauthenticated_invalid_)
      ->Increment();
}

void ServiceMetrics::ModelEvent(const std::string& event, bool refused) {
  for (size_t e = 0; e < kModelEvents.size(); ++e) {
    if (event == kModelEvents[e]) {
      model_events_[e][refused ? 1 : 0]->Increment();
      return;
    }
  }
}

void ServiceMetrics::ModelKernelRun(const std::string& model,
                                    const std::string& implementation) {
  const auto backend = backend_of_.find(implementation);
  std::pair<std::string, std::string> key(
      model, backend != backend_of_.end() ? backend->second : "other");
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&model_runs_mutex_);
    auto [it, added] = model_run_counters_.try_emplace(key, nullptr);
    if (added) {
      it->second =
          &model_runs_->Add({{"model", key.first}, {"backend", key.second}});
    }
    counter = it->second;
  }
  counter->Increment();
}

void ServiceMetrics::SetHeldMemorySource(
    std::function<std::optional<attn::HeldMemoryStats>()> source) {
  static_cast<SampledCollector*>(sampled_.get())
      ->SetHeldMemorySource(std::move(source));
}

void ServiceMetrics::SetStoredRowsSource(
    std::function<std::vector<StoredRows>()> source) {
  static_cast<SampledCollector*>(sampled_.get())
      ->SetStoredRowsSource(std::move(source));
}

void ServiceMetrics::RowsChanged(const std::string& model, bool evict,
                                 absl::Duration took) {
  if (evict) {
    evictions_->Add({{"model", model}}).Increment();
    return;
  }
  appends_->Add({{"model", model}}).Increment();
  // 1 ms to 4 s: an append is two fsyncs and a copy of its rows.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 4};
  append_seconds_->Add({{"model", model}}, kBuckets)
      .Observe(absl::ToDoubleSeconds(took));
}

void ServiceMetrics::Compacted(const std::string& model) {
  compactions_->Add({{"model", model}}).Increment();
}

void ServiceMetrics::SetQueueDepthSource(std::function<int()> source) {
  static_cast<SampledCollector*>(sampled_.get())
      ->SetQueueDepthSource(std::move(source));
}

void ServiceMetrics::SetInflightBytesSource(std::function<int64_t()> source) {
  static_cast<SampledCollector*>(sampled_.get())
      ->SetInflightBytesSource(std::move(source));
}

std::shared_ptr<prometheus::Collectable> ServiceMetrics::sampled() const {
  return sampled_;
}

void ServiceMetrics::RequestStarted() { inflight_->Increment(); }

void ServiceMetrics::RequestRefused(std::optional<Operation> operation,
                                    Protocol protocol, absl::StatusCode code) {
  const int index = static_cast<int>(code);
  const int c = index >= 0 && index < 17 ? index : 2;
  const int p = static_cast<int>(protocol);
  if (operation.has_value()) {
    per_operation_[static_cast<int>(*operation)].requests_by_code[p][c]->Increment();
  } else {
    unresolved_by_code_[p][c]->Increment();
  }
}

void ServiceMetrics::RequestFinished(Operation operation, Protocol protocol,
                                     absl::StatusCode code,
                                     absl::Duration total) {
  inflight_->Decrement();
  PerOperation& per_operation = per_operation_[static_cast<int>(operation)];
  const int index = static_cast<int>(code);
  const int p = static_cast<int>(protocol);
  per_operation.requests_by_code[p][index >= 0 && index < 17 ? index : 2]
      ->Increment();
  per_operation.duration[p]->Observe(absl::ToDoubleSeconds(total));
  switch (code) {
    case absl::StatusCode::kResourceExhausted:
      per_operation.rejected_resource_exhausted->Increment();
      break;
    case absl::StatusCode::kDeadlineExceeded:
      per_operation.rejected_deadline->Increment();
      break;
    case absl::StatusCode::kCancelled:
      per_operation.rejected_cancelled->Increment();
      break;
    case absl::StatusCode::kUnavailable:
      per_operation.rejected_unavailable->Increment();
      break;
    default:
      break;
  }
}

void ServiceMetrics::BatchExecuted(Operation operation, int requests,
                                   int64_t computed_elements,
                                   int64_t useful_elements) {
  PerOperation& per_operation = per_operation_[static_cast<int>(operation)];
  per_operation.batch_size->Observe(requests);
  per_operation.batch_computed->Increment(static_cast<double>(computed_elements));
  per_operation.batch_padding->Increment(
      static_cast<double>(computed_elements - useful_elements));
}

void ServiceMetrics::QueueWait(Operation operation, absl::Duration wait) {
  per_operation_[static_cast<int>(operation)].queue_wait->Observe(
      absl::ToDoubleSeconds(wait));
}

void ServiceMetrics::KernelRun(Operation operation, const std::string& implementation,
                               absl::Duration kernel) {
  PerOperation& per_operation = per_operation_[static_cast<int>(operation)];
  auto histogram = per_operation.kernel.find(implementation);
  (histogram != per_operation.kernel.end() ? histogram->second : per_operation.kernel_other)
      ->Observe(absl::ToDoubleSeconds(kernel));
  auto it = per_operation.runs.find(implementation);
  (it != per_operation.runs.end() ? it->second : per_operation.runs_other)->Increment();
}

}  // namespace attnserve
