// The gRPC front door of the process: one server on one port carrying both
// APIs over the serving core (attention.v1.AttentionService and KServe v2's
// inference.GRPCInferenceService), the standard health service and, unless
// turned off, reflection; its transport security (TLS, mutual TLS), bearer
// tokens (server/api/auth.h, reloaded when the file changes and on
// Reload()), and the transport's own limits (keepalive, connection age and
// idleness, handshake time, streams per connection, gRPC's memory quota,
// the message size).
//
// Thread-safe. Borrows the core and the repository, which must outlive it.
// The server is never shut down through gRPC: the process drains through
// the core (server/core/server_core.h) and exits, because gRPC 1.51's
// Shutdown cancels calls still arriving as CANCELLED, which no client
// retries.
#ifndef ATTNSERVE_SERVER_API_GRPC_SERVER_H_
#define ATTNSERVE_SERVER_API_GRPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "server/api/attention_service.h"
#include "server/api/auth.h"
#include "server/api/inference_service.h"
#include "server/core/server_core.h"
#include "server/repository/model_repository.h"

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
  std::string auth_tokens_file;
  // Live model control (server/api/inference_service.h's ModelControl; the
  // permission follows from tokens being on).
  bool explicit_model_control = false;
  int max_batch_size = 32;  // what KServe's ModelConfig reports
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

class GrpcServer {
 public:
  // Reads the certificates and the token file (INVALID_ARGUMENT naming the
  // flag and the problem: a missing or non-PEM file, TLS flags that do not
  // go together, tokens without TLS), builds the services over `core` and
  // `repository` (may be null) and listens: SERVING from then on.
  // UNAVAILABLE when the address cannot be bound. Logs what it set up.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options, ServerCore* core,
      ModelRepository* repository);

  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;
  ~GrpcServer();  // stops the token file's watcher; the server stays up

  int port() const { return port_; }
  // The bearer tokens of --auth_tokens_file (null without), for the HTTP
  // port to check against the same store.
  const TokenStore* tokens() const { return tokens_.get(); }

  // The drain notice: health and KServe readiness say NOT_SERVING while
  // calls are still served.
  void SetNotServing();

  // Reads the token file again (SIGHUP); a line for the log saying what
  // happened (the previous tokens stay if the file is bad).
  std::string ReloadTokens();

 private:
  GrpcServer() = default;
  void WatchTokenFile();

  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<AttentionService> typed_;
  std::unique_ptr<InferenceService> kserve_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_watching_;
  std::thread token_watch_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_GRPC_SERVER_H_
