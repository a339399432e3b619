// The HTTP/REST front door of the process: HTTP/1.1 on its own port, each
// request handed to the REST front end it is given (KServe v2's,
// server/kserve/rest_service.h) as a RestCall (server/transport/
// rest_call.h), with the gRPC port's promises: the same message size limit,
// admission and drain, the same TLS certificates and bearer tokens (health
// stays open), and the HTTP server's own defences. It knows no model.
//
// Built on libevent's evhttp: `threads` event loops, each with its own
// listening socket on the port (SO_REUSEPORT; the kernel spreads new
// connections). A loop reads a request, routes it and, for inference, hands
// it to the core; the core's worker writes the response body and the loop
// sends it. Defences, each a flag:
// - at most `max_connections` open connections: a connection over the cap
//   is closed at once and counted (attnserve_connections_refused_total);
// - a request must arrive whole within `request_timeout` of its
//   connection opening or of the previous response (slow clients:
//   slowloris); an idle keep-alive connection is closed after it too, and
//   a connection that neither reads nor writes for that long;
// - headers at most `max_header_bytes` (so also their count); a body over
//   `max_body_bytes` is refused (413) before it is read, and what the
//   client still sends is drained (at most 5 s) rather than reset, so that
//   it reads the 413.
//
// Thread-safe. Borrows the metrics, the token store and the handler, which
// must outlive it. Like the gRPC server it is never shut down: the process
// drains through the core and exits.
#ifndef ATTNSERVE_SERVER_TRANSPORT_HTTP_SERVER_H_
#define ATTNSERVE_SERVER_TRANSPORT_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/execution/metrics.h"
#include "server/transport/auth.h"
#include "server/transport/rest_call.h"

namespace attnserve {

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // Triton's; the caller does not start it for 0
  int threads = 1;  // event loops
  int max_connections = 1000;
  int64_t max_body_bytes = int64_t{256} << 20;  // --max_message_bytes
  int max_header_bytes = 16 << 10;
  absl::Duration request_timeout = absl::Seconds(30);
  // TLS as on the gRPC port (mutual with a client CA); plaintext without.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
};

class HttpServer {
 public:
  // Sets up TLS (INVALID_ARGUMENT naming the flag for files OpenSSL cannot
  // use), binds every loop's socket (UNAVAILABLE when the address cannot be
  // bound) and starts serving. `tokens` (may be null: no authentication)
  // needs TLS, as on the gRPC port. Logs what it set up.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, ServiceMetrics* metrics,
      const TokenStore* tokens, RestHandler* handler);

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  // Not for a serving process (see above); stops the loops for tests.
  ~HttpServer();

  int port() const { return port_; }

  // Used by the loops (http_server.cc).
  class Loop;

 private:
  HttpServer() = default;

  HttpServerOptions options_;
  ServiceMetrics* metrics_ = nullptr;
  const TokenStore* tokens_ = nullptr;
  RestHandler* handler_ = nullptr;
  void* tls_context_ = nullptr;  // SSL_CTX*, or null for plaintext
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<int> open_connections_{0};
  int port_ = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TRANSPORT_HTTP_SERVER_H_
