#include "server/transport/grpc_server.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace attnserve {
namespace {

// The contents of a PEM file named by `flag`.
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  if (!in || !(contents << in.rdbuf())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": cannot be read"));
  }
  if (contents.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": not a PEM file"));
  }
  return contents.str();
}

// The port's credentials: insecure without a certificate, TLS with one,
// mutual TLS with a client CA as well.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const GrpcServerOptions& options, bool tokens) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert");
    }
    if (tokens) {
      return absl::InvalidArgumentError(
          "--auth_tokens_file needs --tls_cert: tokens sent in clear text "
          "are tokens given away");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(
      options.tls_client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> pem = ReadPem("tls_key", options.tls_key);
  if (!pem.ok()) return pem.status();
  pair.private_key = *std::move(pem);
  pem = ReadPem("tls_cert", options.tls_cert);
  if (!pem.ok()) return pem.status();
  pair.cert_chain = *std::move(pem);
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca.empty()) {
    pem = ReadPem("tls_client_ca", options.tls_client_ca);
    if (!pem.ok()) return pem.status();
    ssl.pem_root_certs = *std::move(pem);
  }
  return grpc::SslServerCredentials(ssl);
}

// The transport's limits and connection management (see the flags):
// keepalive finds dead peers; a bounded connection age makes long-lived
// clients rebalance across replicas behind L4 load balancers; streams per
// connection, handshakes and the memory of requests still being received
// are bounded before a call reaches the core's own admission.
void ApplyTransportOptions(const GrpcServerOptions& options,
                           grpc::ServerBuilder* builder) {
  // gRPC sets SO_REUSEPORT by default, so a second attnserve on a busy port
  // would start and silently share it; fail at boot instead.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                              options.keepalive_time_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              options.keepalive_timeout_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      options.min_client_ping_interval_ms);
  if (options.max_connection_age_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                                options.max_connection_age_ms);
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                options.max_connection_age_grace_ms);
  }
  if (options.max_connection_idle_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                                options.max_connection_idle_ms);
  }
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              options.handshake_timeout_ms);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              options.max_concurrent_streams);
  grpc::ResourceQuota quota("attnserve");
  quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
  builder->SetResourceQuota(quota);
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, ServiceMetrics* metrics,
    const TokenStore* tokens, const std::vector<GrpcService>& services) {
  std::unique_ptr<GrpcServer> server(new GrpcServer);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      Credentials(options, tokens != nullptr);
  if (!credentials.ok()) return credentials.status();
  if (tokens != nullptr) {
    (*credentials)
        ->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(
            tokens, [metrics](AuthFailure why) {
              metrics->Unauthenticated(why == AuthFailure::kMissingToken);
            }));
  }
  absl::FPrintF(stderr, "attnserve: gRPC transport: %s\n",
                options.tls_cert.empty()
                    ? "plaintext"
                    : (options.tls_client_ca.empty()
                           ? "TLS"
                           : "mutual TLS (client certificates required)"));

  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }
  grpc::ServerBuilder builder;
  ApplyTransportOptions(options, &builder);
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(address, *credentials, &server->port_);
  for (const GrpcService& service : services) {
    builder.RegisterService(service.service);
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  grpc::HealthCheckServiceInterface* health =
      server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  for (const GrpcService& service : services) {
    health->SetServingStatus(service.name, true);
  }
  return server;
}

void GrpcServer::SetNotServing() {
  server_->GetHealthCheckService()->SetServingStatus(false);
}

}  // namespace attnserve
