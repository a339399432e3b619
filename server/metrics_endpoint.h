// The Prometheus endpoint: http://host:port/metrics, served by
// prometheus-cpp's Exposer (civetweb underneath) from the core's metrics.
//
// civetweb gives each connection a worker thread until its request is
// read, or 1 s passes from the request's start (civetweb 1.15 read_message:
// a slow client is dropped after 1-2 x the timeout however often it sends a
// byte); accepted connections beyond the workers wait in a queue, then in
// the kernel's backlog. With prometheus-cpp's 2 threads and civetweb's
// 30 s, two half-sent requests silenced /metrics for 30 s; with 16 threads
// and 10 s, 500 slow clients silenced it until they left. A scrape is one
// short request, so 1 s is ample, and 256 workers (idle threads cost no CPU
// and little memory) take hundreds of slow clients at once (tests/faults,
// scenario scrape).
#ifndef ATTNSERVE_SERVER_METRICS_ENDPOINT_H_
#define ATTNSERVE_SERVER_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "server/execution/metrics.h"

namespace attnserve {

// Serves `metrics` (which must outlive the returned Exposer) on host:port
// (port 0: a free one; the Exposer's GetListeningPorts says which).
// UNAVAILABLE naming the address when it cannot be bound.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& host, int port, ServiceMetrics* metrics);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_METRICS_ENDPOINT_H_
