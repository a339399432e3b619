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
// A call that ends UNAVAILABLE may be sent again (LoadOptions::retries):
// gRPC's own answer for a call that never reached a server that could take
// it, as when a proxy's GOAWAY crosses a new call. Its latency then counts
// from its first send, and the report counts the resends.
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
//
// The pieces, a header each; this one includes them all, so that a user of
// `load` needs this header alone:
//   client/load_rpc.h      the RPCs it drives (--rpc)
//   client/load_pool.h     the request pool (BuildRequestPool)
//   client/load_target.h   which targets count as this machine
//   client/load_arrivals.h the open loop's Poisson arrival times
//   client/load_report.h   the Report, its latency statistics and formats
//   client/load.h          running: LoadOptions and RunLoad (the drivers
//                          themselves are private to load.cc)
#ifndef ATTNSERVE_CLIENT_LOAD_H_
#define ATTNSERVE_CLIENT_LOAD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/load_arrivals.h"  // IWYU pragma: export
#include "client/load_pool.h"      // IWYU pragma: export
#include "client/load_report.h"    // IWYU pragma: export
#include "client/load_rpc.h"       // IWYU pragma: export
#include "client/load_target.h"    // IWYU pragma: export
#include "grpcpp/security/credentials.h"

namespace attnctl {

// How RunLoad drives the server; CheckLoadOptions says whether they fit
// together.
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
  // A call that ends UNAVAILABLE is sent again, the same request, at most
  // this many times, in [0, 10]; 0 counts it as failed at once.
  int retries = 0;
};

// INVALID_ARGUMENT when the options are inconsistent (the message names the
// flag); PERMISSION_DENIED when the target is not loopback and
// !allow_remote. Thread-safe; does not block.
absl::Status CheckLoadOptions(const LoadOptions& options);

// Connects (waiting at most options.deadline), runs the load and reports.
// Blocks for the whole run: warm-up + duration (or until `requests`) + the
// calls then in flight. Thread-compatible; `pool` must be non-empty.
// Errors: those of CheckLoadOptions; UNAVAILABLE when a channel does not
// connect in time. Failed calls are not errors: they are in Report::errors.
absl::StatusOr<Report> RunLoad(const LoadOptions& options,
                               const RequestPool& pool);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_H_
