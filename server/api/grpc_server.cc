#include "server/api/grpc_server.h"

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
    const GrpcServerOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert");
    }
    if (!options.auth_tokens_file.empty()) {
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
    const GrpcServerOptions& options, ServerCore* core,
    ModelRepository* repository) {
  std::unique_ptr<GrpcServer> server(new GrpcServer);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      Credentials(options);
  if (!credentials.ok()) return credentials.status();
  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenStore>> tokens =
        TokenStore::Load(options.auth_tokens_file);
    if (!tokens.ok()) return tokens.status();
    server->tokens_ = *std::move(tokens);
    (*credentials)
        ->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(
            server->tokens_.get(),
            [metrics = &core->metrics()](AuthFailure why) {
              metrics->Unauthenticated(why == AuthFailure::kMissingToken);
            }));
    absl::FPrintF(stderr,
                  "attnserve: token authentication: %d tokens from %s "
                  "(health checks stay open; SIGHUP or an edit reloads)\n",
                  server->tokens_->size(), options.auth_tokens_file);
  }
  absl::FPrintF(stderr, "attnserve: gRPC transport: %s\n",
                options.tls_cert.empty()
                    ? "plaintext"
                    : (options.tls_client_ca.empty()
                           ? "TLS"
                           : "mutual TLS (client certificates required)"));

  server->typed_ =
      std::make_unique<AttentionService>(&core->calls(), repository);
  ModelControl model_control;
  model_control.explicit_mode = options.explicit_model_control;
  model_control.needs_permission = server->tokens_ != nullptr;
  server->kserve_ = std::make_unique<InferenceService>(
      &core->calls(), repository, core->batching(), options.max_batch_size,
      model_control);

  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }
  grpc::ServerBuilder builder;
  ApplyTransportOptions(options, &builder);
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(address, *credentials, &server->port_);
  builder.RegisterService(server->typed_.get());
  builder.RegisterService(server->kserve_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  grpc::HealthCheckServiceInterface* health =
      server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("attention.v1.AttentionService", true);
  health->SetServingStatus("inference.GRPCInferenceService", true);
  if (server->tokens_ != nullptr) {
    GrpcServer* raw = server.get();
    server->token_watch_ = std::thread([raw] { raw->WatchTokenFile(); });
  }
  return server;
}

GrpcServer::~GrpcServer() {
  if (token_watch_.joinable()) {
    stop_watching_.Notify();
    token_watch_.join();
  }
}

void GrpcServer::SetNotServing() {
  server_->GetHealthCheckService()->SetServingStatus(false);
  kserve_->SetReady(false);
}

std::string GrpcServer::ReloadTokens() {
  if (tokens_ == nullptr) return "nothing to reload";
  if (absl::Status reloaded = tokens_->Reload(); !reloaded.ok()) {
    return absl::StrCat(reloaded.message(), "; the previous tokens stay");
  }
  return absl::StrFormat("reloaded %d tokens from %s", tokens_->size(),
                         tokens_->path());
}

// An edited token file takes effect without a signal too: polled every
// second (cheap: one stat()).
void GrpcServer::WatchTokenFile() {
  while (!stop_watching_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    absl::StatusOr<bool> reloaded = tokens_->ReloadIfChanged();
    if (!reloaded.ok()) {
      absl::FPrintF(stderr,
                    "attnserve: token file changed: %s; the previous tokens "
                    "stay\n",
                    reloaded.status().message());
    } else if (*reloaded) {
      absl::FPrintF(stderr,
                    "attnserve: token file changed: reloaded %d tokens\n",
                    tokens_->size());
    }
  }
}

}  // namespace attnserve
