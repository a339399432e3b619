// `attnctl load`: a load generator for attnserve.
//
// It pre-builds a pool of serialized requests (BuildRequestPool), then drives
// them at the server from --client_threads threads (RunLoad), each with its
// own channel and completion queue, and summarizes what came back (Report).
//
// - Closed loop (LoadOptions::target_rate == 0): `concurrency` requests are
//   in flight at all times; each completion starts the next request.
//   Latency is measured from the moment a request is sent.
// - Open loop (target_rate > 0): requests arrive as a Poisson process (seeded
//   exponential inter-arrival times), whatever the server's pace, with at
//   most `max_in_flight` in flight; an arrival that finds the cap full is
//   dropped and counted. Latency is measured from the scheduled arrival time,
//   so a client that falls behind shows up as latency instead of being
//   hidden (no coordinated omission).
//
// The measured window opens `warmup` after the start: only requests sent at
// or after it count. Sending stops after `duration` or `requests` measured
// requests, whichever comes first; the requests still in flight then are
// waited for (each at most --deadline) and counted.
//
// Calls go through grpc::GenericStub with the pool's pre-serialized bytes:
// no protobuf work per request, and responses are not parsed (the status
// decides success). This is the completion-queue API, which measured ~40%
// faster per call than the callback API on our 2-core machines.
#ifndef ATTNSERVE_CLIENT_LOAD_H_
#define ATTNSERVE_CLIENT_LOAD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/requests.h"
#include "grpcpp/security/credentials.h"

namespace attnctl {

// --- The RPCs `load` can drive.

enum class LoadRpc {
  kAttention,
  kMaskedSoftmax,
  kBatchMatmul,
  kAdditiveAttention,
  kNadarayaWatson,
  kFitBandwidth,
  kHealth,  // grpc.health.v1.Health/Check: the per-call overhead baseline
};

// "attention" | "masked-softmax" | "batch-matmul" | "additive-attention" |
// "nadaraya-watson" | "fit-bandwidth" | "health" (the attnctl subcommand
// names). INVALID_ARGUMENT otherwise.
absl::StatusOr<LoadRpc> ParseLoadRpc(absl::string_view text);
absl::string_view LoadRpcName(LoadRpc rpc);

// --- The request pool.

// An inclusive integer range, "lo:hi".
struct IntRange {
  int64_t lo = 0;
  int64_t hi = 0;
};

// "16:128" -> {16, 128}; needs min_lo <= lo <= hi. INVALID_ARGUMENT
// otherwise (the message does not name the flag).
absl::StatusOr<IntRange> ParseRange(absl::string_view text, int64_t min_lo);

// One --mix variant: --shape items and the variant's share of the pool.
struct MixVariant {
  double weight = 1.0;
  std::vector<NamedShape> shapes;
};

// "[W:]NAME=DIMS,NAME=DIMS;[W:]NAME=DIMS,..." -> variants. W is a positive
// number (default 1); empty variants (a trailing ';') are skipped; at least
// one is needed. INVALID_ARGUMENT names the variant at fault.
absl::StatusOr<std::vector<MixVariant>> ParseMix(absl::string_view text);

inline constexpr int kDefaultPoolSize = 64;
// The most bytes of serialized requests a pool may hold.
inline constexpr int64_t kMaxPoolBytes = int64_t{1} << 30;

struct PoolOptions {
  LoadRpc rpc = LoadRpc::kAttention;
  // The request flags, as for the RPC's own subcommand. Entry i of the pool
  // is generated with seed request.seed + i; `shapes` is the base that every
  // mix variant's shapes override, name by name.
  RequestOptions request;
  // A request in protobuf's JSON mapping (--input) that every entry starts
  // from; empty: start from an empty request.
  std::string input_json;
  // Empty: one variant, `request.shapes` alone.
  std::vector<MixVariant> mix;
  // Per entry, a key length drawn uniformly from the range: the length
  // (second-to-last) dimension of keys and values for attention and
  // additive-attention, the last dimension of x for masked-softmax.
  std::optional<IntRange> lk_range;
  // Per entry, valid lengths of shape (B,), each drawn uniformly from the
  // range clipped to [0, K] (K: the entry's key length). Same RPCs as
  // lk_range; excludes request.valid_lens.
  std::optional<IntRange> valid_lens_range;
  int pool_size = kDefaultPoolSize;
  // grpc.health.v1 Check's `service` (for LoadRpc::kHealth).
  std::string health_service;
};

struct RequestPool {
  LoadRpc rpc = LoadRpc::kAttention;
  // The full method name, like "/attention.v1.AttentionService/BatchMatmul".
  std::string method;
  // Serialized request messages, in the order calls cycle through them.
  std::vector<std::string> requests;
  // How many entries each mix variant got (one count without --mix).
  std::vector<int> variant_counts;
  int64_t bytes = 0;
};

// Builds the pool: `pool_size` requests (one for health, whose request never
// varies), each variant getting a share proportional to its weight
// (largest remainder; a variant whose share rounds to zero gets no entry),
// in a seeded shuffled order. Deterministic for given options.
//
// Thread-compatible; does not block. INVALID_ARGUMENT (a usage error):
// a bad --input or --shape for the RPC, lk_range/valid_lens_range for an RPC
// they do not apply to or a tensor of too low rank, valid_lens_range with
// request.valid_lens, pool_size < 1, or a pool over kMaxPoolBytes.
absl::StatusOr<RequestPool> BuildRequestPool(const PoolOptions& options);

// --- Running.

struct LoadOptions {
  std::string target;  // host:port or a gRPC target URI
  // Drive a target that is not loopback. Off by default, so that a load
  // test never reaches a production server by a mistyped target.
  bool allow_remote = false;
  int max_receive_bytes = 256 << 20;
  // TLS and tokens (client/credentials.h); null means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Overrides the name the server's certificate is checked against.
  std::string server_name;
  // Per call; absl::InfiniteDuration() for none.
  absl::Duration deadline = absl::Seconds(10);
  // Closed loop: requests in flight at all times (>= client_threads).
  int concurrency = 1;
  // Open loop when > 0: the target arrival rate, requests/s.
  double target_rate = 0;
  // Open loop: the most requests in flight (>= client_threads).
  int max_in_flight = 4096;
  // How long to send after the warm-up; absl::InfiniteDuration() to stop on
  // `requests` alone.
  absl::Duration duration = absl::Seconds(10);
  // Stop after this many measured requests sent; 0: no limit.
  int64_t requests = 0;
  absl::Duration warmup = absl::Seconds(1);
  // Threads, each with its own channel (connection) and completion queue and
  // its share of the concurrency, cap and rate. An open-loop thread has a
  // second thread that sends on schedule.
  int client_threads = 1;
  uint32_t seed = 0;  // of the arrival times
};

// INVALID_ARGUMENT when the options are inconsistent (the message names the
// flag); PERMISSION_DENIED when the target is not loopback and
// !allow_remote.
absl::Status CheckLoadOptions(const LoadOptions& options);

// True when `target` can only reach this machine: localhost, 127.0.0.0/8,
// ::1 (or ::ffff:127.x.y.z), with or without a port, brackets or a dns:,
// ipv4: or ipv6: scheme (every address of an ipv4:/ipv6: list), and unix:
// sockets. Other names are not resolved, so they are not loopback.
bool IsLoopbackTarget(absl::string_view target);

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

// Connects (waiting at most options.deadline), runs the load and reports.
// Blocks for the whole run: warm-up + duration (or until `requests`) + the
// calls then in flight. Thread-compatible; `pool` must be non-empty.
// Errors: those of CheckLoadOptions; UNAVAILABLE when a channel does not
// connect in time. Failed calls are not errors: they are in Report::errors.
absl::StatusOr<Report> RunLoad(const LoadOptions& options,
                               const RequestPool& pool);

// The report for people: a few aligned lines, ending in a newline.
std::string FormatReportText(const Report& report);
// The report as one line of JSON (no trailing newline):
//   {"rpc": "attention", "mode": "closed", "concurrency": 64,
//    "client_threads": 1, "pool_size": 64, "warmup_s": 1, "duration_s": 5.0,
//    "requests": N, "ok": N, "throughput_rps": ...,
//    "latency_ms": {"p50": ..., "p90": ..., "p99": ..., "p999": ...,
//                   "max": ..., "mean": ...},
//    "errors": {"INVALID_ARGUMENT": 3}, "dropped": 0}
// plus "first_error": "CODE: message" when a call failed.
// Open loop has "mode": "open", "target_rate", "max_in_flight",
// "achieved_rate_rps" and "send_lag_ms" (like "latency_ms") instead of
// "concurrency"; "latency_ms" is null when no request succeeded.
std::string FormatReportJson(const Report& report);

// --- Arrivals.

// The inter-arrival times of a Poisson process: exponential with mean
// 1/rate. Deterministic for a seed. Thread-compatible.
class PoissonArrivals {
 public:
  // rate_per_second > 0.
  PoissonArrivals(double rate_per_second, uint64_t seed);

  // The time to the next arrival, in nanoseconds (>= 0).
  int64_t NextNanos();

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> seconds_;
};

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_H_
