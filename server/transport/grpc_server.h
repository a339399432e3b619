// The gRPC front door of the process: one server on one port carrying the
// services it is given (the typed API, KServe v2: server/typed/,
// server/kserve/), the standard health service and, unless turned off,
// reflection; its transport security (TLS, mutual TLS), bearer tokens
// (server/transport/auth.h), and the transport's own limits (keepalive,
// connection age and idleness, handshake time, streams per connection,
// gRPC's memory quota, the message size). It knows no model and no
// service's messages.
//
// Thread-safe. Borrows the metrics, the token store and the services, which
// must outlive it.
// The server is never shut down through gRPC: the process drains through
// the core (server/execution/execution_stack.h) and exits, because gRPC 1.51's
// Shutdown cancels calls still arriving as CANCELLED, which no client
// retries.
#ifndef ATTNSERVE_SERVER_TRANSPORT_GRPC_SERVER_H_
#define ATTNSERVE_SERVER_TRANSPORT_GRPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/execution/metrics.h"
#include "server/transport/auth.h"

namespace attnserve {

struct GrpcServerOptions {
  std::string host = "0.0.0.0";
  int port = 8001;  // 0: a free port (GrpcServer::port() says which)
  int max_message_bytes = 256 << 20;
  bool reflection = true;
  // Transport security: TLS with a certificate and key (PEM files), mutual
  // TLS with a client CA as well; plaintext without. Bearer tokens need TLS.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Connection management and the transport's limits (see the flags).
  int keepalive_time_ms = 60000;
  int keepalive_timeout_ms = 20000;
  int min_client_ping_interval_ms = 10000;
  int max_connection_age_ms = 300000;  // 0: none
  int max_connection_age_grace_ms = 60000;
  int max_connection_idle_ms = 600000;  // 0: none
  int handshake_timeout_ms = 20000;
  int max_concurrent_streams = 64;
  int64_t memory_quota_bytes = int64_t{1} << 30;
};

// A service the server carries, under its name in the health service.
struct GrpcService {
  std::string name;  // e.g. "inference.GRPCInferenceService"
  grpc::Service* service;
};

class GrpcServer {
 public:
  // Reads the certificates (INVALID_ARGUMENT naming the flag and the
  // problem: a missing or non-PEM file, TLS flags that do not go together,
  // tokens without TLS), checks every call's bearer token against `tokens`
  // when given (counting refusals in `metrics`), registers `services` and
  // listens: SERVING from then on, for the server and each service by
  // name. UNAVAILABLE when the address cannot be bound. Logs what it set
  // up.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options, ServiceMetrics* metrics,
      const TokenStore* tokens, const std::vector<GrpcService>& services);

  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }

  // The drain notice: the health service says NOT_SERVING while calls are
  // still served.
  void SetNotServing();

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TRANSPORT_GRPC_SERVER_H_
