#include "server/metrics_endpoint.h"

#include <exception>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& host, int port, ServiceMetrics* metrics) {
  constexpr int kThreads = 256;
  const std::string address = absl::StrCat(host, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {  // civetweb throws when it cannot bind
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address,
        "num_threads", std::to_string(kThreads),
        "request_timeout_ms", "1000",
        "connection_queue", "256",
        "listen_backlog", "1024",
        "max_request_size", "8192"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  exposer->RegisterCollectable(metrics->registry());
  exposer->RegisterCollectable(metrics->sampled());
  return exposer;
}

}  // namespace attnserve
