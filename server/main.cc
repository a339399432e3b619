// attnserve: the gRPC front of the attention kernel library.
//
// Today it serves the standard grpc.health.v1.Health service and server
// reflection; the attention API arrives with the gRPC API issue. It creates
// the kernel engine at startup so a broken backend fails boot, not a request.
//
// Lifecycle: SIGTERM or SIGINT flips health to NOT_SERVING, lets in-flight
// calls finish for up to --grace_period_ms, cancels the rest and exits 0.
// Startup failures (bad flags, engine, port) exit 1.
//
// Logging: one line per event to stderr through absl::FPrintF (Abseil
// 20220623 has no absl/log).

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attn/engine.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

ABSL_FLAG(int32_t, grpc_port, 8001,
          "TCP port for gRPC; 0 picks a free port (logged at startup).");
ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address to bind gRPC to, e.g. 0.0.0.0, 127.0.0.1 or [::].");
ABSL_FLAG(int32_t, grace_period_ms, 5000,
          "On SIGTERM/SIGINT, how long in-flight calls may run before they "
          "are cancelled.");

namespace {

// Blocks SIGTERM and SIGINT in the calling thread. Called first thing in
// main, so every thread started later (gRPC's, OpenMP's) inherits the mask
// and the signals stay pending until WaitForTerminationSignal takes them.
void BlockTerminationSignals(sigset_t* signals) {
  sigemptyset(signals);
  sigaddset(signals, SIGTERM);
  sigaddset(signals, SIGINT);
  if (int err = pthread_sigmask(SIG_BLOCK, signals, nullptr); err != 0) {
    absl::FPrintF(stderr, "attnserve: pthread_sigmask: %s\n",
                  std::strerror(err));
    std::exit(1);
  }
}

// Blocks until SIGTERM or SIGINT arrives; returns its number.
int WaitForTerminationSignal(const sigset_t& signals) {
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  return signal_number;
}

}  // namespace

int main(int argc, char** argv) {
  sigset_t termination_signals;
  BlockTerminationSignals(&termination_signals);

  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    absl::FPrintF(stderr, "attnserve: unexpected argument '%s'\n",
                  positional[1]);
    return 1;
  }
  const int32_t port = absl::GetFlag(FLAGS_grpc_port);
  const std::string host = absl::GetFlag(FLAGS_host);
  const int32_t grace_period_ms = absl::GetFlag(FLAGS_grace_period_ms);
  if (port < 0 || port > 65535) {
    absl::FPrintF(stderr, "attnserve: --grpc_port=%d is not in [0, 65535]\n",
                  port);
    return 1;
  }
  if (grace_period_ms < 0) {
    absl::FPrintF(stderr, "attnserve: --grace_period_ms=%d is negative\n",
                  grace_period_ms);
    return 1;
  }

  absl::StatusOr<std::unique_ptr<attn::Engine>> engine =
      attn::Engine::Create(attn::EngineOptions{});
  if (!engine.ok()) {
    absl::FPrintF(stderr, "attnserve: creating the engine: %s\n",
                  engine.status().ToString());
    return 1;
  }
  const std::vector<std::string> backends = engine.value()->backend_names();
  for (size_t i = 0; i < backends.size(); ++i) {
    absl::FPrintF(stderr, "attnserve: backend %d of %d: %s\n", i + 1,
                  backends.size(), backends[i]);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const std::string address = absl::StrCat(host, ":", port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, so a second attnserve on a busy port
  // would start and silently share it; fail at boot instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &bound_port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    absl::FPrintF(stderr, "attnserve: cannot listen on %s\n", address);
    return 1;
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  absl::FPrintF(stderr, "attnserve listening on %s:%d\n", host, bound_port);

  const int signal_number = WaitForTerminationSignal(termination_signals);
  absl::FPrintF(stderr,
                "attnserve: %s received; NOT_SERVING, draining for up to "
                "%d ms\n",
                signal_number == SIGTERM ? "SIGTERM" : "SIGINT",
                grace_period_ms);
  health->SetServingStatus(false);
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(grace_period_ms));
  server->Wait();
  absl::FPrintF(stderr, "attnserve: stopped\n");
  return 0;
}
