// What `attnctl load` reports: the latency statistics of a run, the Report
// RunLoad (client/load.h) fills in, and its two renderings, for people and
// as one line of JSON for scripts.
//
// Thread-compatible: pure functions over the caller's objects; none blocks
// or fails.
#ifndef ATTNSERVE_CLIENT_LOAD_REPORT_H_
#define ATTNSERVE_CLIENT_LOAD_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnctl {

struct LatencySummary {
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double p999_ms = 0;
  double max_ms = 0;
  double mean_ms = 0;
};

// The nearest-rank percentile p (0 < p <= 100) of `sorted` (ascending,
// non-empty): its ceil(p/100 * n)-th smallest element.
int64_t Percentile(const std::vector<int64_t>& sorted, double p);

// Sorts `nanos` (latencies in nanoseconds) and summarizes it in
// milliseconds; nullopt when it is empty.
std::optional<LatencySummary> SummarizeLatencies(std::vector<int64_t> nanos);

// What one RunLoad measured (client/load.h), with the settings it ran with.
struct Report {
  std::string rpc;
  bool open_loop = false;
  int concurrency = 0;     // closed loop
  double target_rate = 0;  // open loop
  int max_in_flight = 0;   // open loop
  int client_threads = 1;
  int pool_size = 0;
  // Pool entries per --mix variant, in --mix order.
  std::vector<int> variant_counts;
  double warmup_s = 0;
  // The measured window: from the end of the warm-up to the last measured
  // completion.
  double duration_s = 0;
  // Measured requests completed, successful or not; `ok` of them succeeded.
  int64_t requests = 0;
  int64_t ok = 0;
  // Successful responses per second of the window.
  double throughput_rps = 0;
  // Over the successful requests; absent when none succeeded.
  std::optional<LatencySummary> latency;
  // Failed requests by status code name, like "DEADLINE_EXCEEDED".
  std::map<std::string, int64_t> errors;
  // "CODE: message" of one failed call (the first one a client thread saw,
  // warm-up included), to say why; empty when none failed.
  std::string first_error;
  // Resends of measured calls that ended UNAVAILABLE (LoadOptions::retries);
  // a call that succeeded on a resend is in `ok`, its latency from its first
  // send.
  int64_t retried = 0;
  // Open loop: measured arrivals that found max_in_flight requests in flight.
  int64_t dropped = 0;
  // Open loop: measured requests sent per second of the sending window (the
  // warm-up's end to when sending stopped).
  double achieved_rate_rps = 0;
  // Open loop: how late the measured requests were sent after their
  // scheduled arrival (timer wake-up, or a client falling behind); part of
  // `latency`.
  std::optional<LatencySummary> send_lag;
};

// The report for people: a few aligned lines, ending in a newline.
std::string FormatReportText(const Report& report);
// The report as one line of JSON (no trailing newline):
//   {"rpc": "attention", "mode": "closed", "concurrency": 64,
//    "client_threads": 1, "pool_size": 64, "warmup_s": 1, "duration_s": 5.0,
//    "requests": N, "ok": N, "throughput_rps": ...,
//    "latency_ms": {"p50": ..., "p90": ..., "p99": ..., "p999": ...,
//                   "max": ..., "mean": ...},
//    "errors": {"INVALID_ARGUMENT": 3}, "dropped": 0, "retried": 0}
// plus "first_error": "CODE: message" when a call failed.
// Open loop has "mode": "open", "target_rate", "max_in_flight",
// "achieved_rate_rps" and "send_lag_ms" (like "latency_ms") instead of
// "concurrency"; "latency_ms" is null when no request succeeded.
std::string FormatReportJson(const Report& report);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_REPORT_H_
