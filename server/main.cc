// attnserve: the gRPC front of the attention kernel library.
//
// Serves attention.v1.AttentionService, the KServe v2 / Triton-compatible
// inference.GRPCInferenceService, the standard grpc.health.v1.Health
// service (SERVING once ready, NOT_SERVING while draining) and server
// reflection on --grpc_port, and Prometheus metrics at
// http://--metrics_host:--metrics_port/metrics. Everything that can fail
// (engine, metric families, ports, certificates, tokens) fails at boot, not
// on a request.
//
// Security (all off by default): TLS and mutual TLS on the gRPC port
// (--tls_cert/--tls_key, --tls_client_ca), bearer tokens (--auth_tokens_file,
// server/api/auth.h; reloaded on SIGHUP and when the file changes), reflection
// off (--reflection=false), metrics on another address (--metrics_host).
//
// Lifecycle: SIGTERM or SIGINT flips health to NOT_SERVING, lets in-flight
// calls finish for up to --grace_period_ms, cancels the rest and exits 0.
// Startup failures (bad flags, engine, port) exit 1.
//
// Logging: one line per event to stderr through absl::FPrintF (Abseil
// 20220623 has no absl/log).

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attn/cpu_isa.h"
#include "attn/engine.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "server/core/accept_guard.h"
#include "server/core/admission.h"
#include "server/api/attention_service.h"
#include "server/api/auth.h"
#include "server/api/inference_service.h"
#include "server/repository/model_repository.h"
#include "server/core/cpu_budget.h"
#include "server/core/server_core.h"

ABSL_FLAG(std::string, backend, "auto",
          "Where kernels run: cpu (oneDNN), cuda (the GPU; start-up fails "
          "without a usable one), or auto (the GPU when one is usable, else "
          "the CPU; start-up says which and why).");
ABSL_FLAG(std::string, max_cpu_isa, "auto",
          "Highest instruction set for attnserve's own CPU kernels: auto (the "
          "best this CPU has), avx512, avx2 or baseline. Every value gives "
          "results within the same documented bounds; lower ones pin a fleet "
          "of mixed "
          "CPUs to one code path. oneDNN's own kernels follow "
          "ONEDNN_MAX_CPU_ISA; start-up logs both.");
ABSL_FLAG(int32_t, cuda_device, 0, "The GPU's CUDA ordinal (--backend=cuda|auto).");
ABSL_FLAG(double, cuda_min_flops, 1e6,
          "With a GPU (--backend=cuda|auto), calls estimated at fewer "
          "floating-point operations than this run on the CPU: a GPU call "
          "pays a fixed round trip (copies, launches, a synchronisation) that "
          "a small call does not repay. 0 sends the GPU every call it takes. "
          "The default is where this project's CPU kernels take about 30 us "
          "on one call; bench/cuda_crossover_bench measures the crossover on "
          "your machine (docs/deploy.md).");
ABSL_FLAG(int32_t, grpc_port, 8001,
          "TCP port for gRPC; 0 picks a free port (logged at startup).");
ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address to bind gRPC to, e.g. 0.0.0.0, 127.0.0.1 or [::].");
ABSL_FLAG(std::string, metrics_host, "",
          "Address to bind the metrics endpoint to; empty means --host. "
          "The endpoint is plain HTTP without authentication: bind it to "
          "127.0.0.1 or a private interface when the gRPC port is public.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port; with --tls_key, the port "
          "speaks TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: with it, clients must present a certificate signed "
          "by one of these CAs (mutual TLS). Needs --tls_cert.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of bearer tokens (one per line, optionally followed by the "
          "permission save_as; see server/api/auth.h). Every call but health "
          "checks then needs `authorization: Bearer <token>`. Reloaded on "
          "SIGHUP and when the file changes. Needs --tls_cert: a token sent "
          "in clear text is a token given away.");
ABSL_FLAG(bool, reflection, true,
          "Serve gRPC server reflection (lets grpcurl-like tools discover the "
          "API); turn off on a public port.");
ABSL_FLAG(int32_t, grace_period_ms, 5000,
          "On SIGTERM/SIGINT, after the drain notice, how long the calls "
          "accepted before it may take to finish; calls arriving meanwhile "
          "are answered UNAVAILABLE (not started: retry elsewhere). The "
          "process exits as soon as every accepted call is answered, or at "
          "the end of this period, abandoning what still runs.");
ABSL_FLAG(int32_t, drain_notice_ms, 1000,
          "On SIGTERM/SIGINT, how long to keep serving while health reports "
          "NOT_SERVING, so that load balancers polling health stop sending "
          "before new calls are refused. 0 refuses them at once.");
ABSL_FLAG(int32_t, metrics_port, 8002,
          "TCP port of the Prometheus /metrics endpoint; 0 picks a free one.");
ABSL_FLAG(int32_t, worker_threads, 0,
          "Threads running kernels; 0 means one per CPU of the process's "
          "budget: the CPUs it may run on, capped by its cgroup CPU quota "
          "(a container's CPU limit), as start-up logs.");
ABSL_FLAG(int32_t, kernel_threads, 1,
          "OpenMP threads one large kernel call may use. 1 (the default) "
          "lets concurrent requests use the cores instead, which keeps tail "
          "latency steady; raise it for few, large requests; 0 means the "
          "CPU budget (see --worker_threads).");
ABSL_FLAG(int32_t, grpc_keepalive_time_ms, 60000,
          "Ping a client after this long without activity on its connection, "
          "so dead peers (a vanished pod, a dropped NAT entry) are found.");
ABSL_FLAG(int32_t, grpc_keepalive_timeout_ms, 20000,
          "Close a connection whose keepalive ping is not answered in this "
          "long.");
ABSL_FLAG(int32_t, grpc_min_client_ping_interval_ms, 10000,
          "Accept client keepalive pings this often (with or without calls "
          "in flight); pings more frequent than this count as abuse, and "
          "repeated abuse closes the connection (gRPC's default is 5 min, "
          "which rejects common client settings).");
ABSL_FLAG(int32_t, grpc_max_connection_age_ms, 300000,
          "Ask a client to reconnect (GOAWAY) after its connection is this "
          "old, give or take gRPC's 10% jitter, so a client behind an L4 "
          "load balancer is spread over new replicas; 0 never.");
ABSL_FLAG(int32_t, grpc_max_connection_age_grace_ms, 60000,
          "Calls in flight on an aged-out connection may finish within this "
          "long before it is closed.");
ABSL_FLAG(int32_t, grpc_max_connection_idle_ms, 600000,
          "Close a connection with no call for this long (GOAWAY; clients "
          "reconnect when they next call); 0 never.");
ABSL_FLAG(int32_t, grpc_handshake_timeout_ms, 20000,
          "Close a new connection that has not completed its TLS and HTTP/2 "
          "handshake in this long (idle sockets that never speak).");
ABSL_FLAG(int32_t, grpc_max_concurrent_streams, 64,
          "Calls one connection may have open at once; a client with more "
          "waits on its side (HTTP/2 flow control), not in server memory.");
ABSL_FLAG(int64_t, grpc_memory_quota_bytes, int64_t{1} << 30,
          "gRPC's resource quota: the memory its transport may hold for "
          "requests not yet handed to attnserve (read buffers, messages "
          "being received); under pressure gRPC shrinks its buffers and "
          "refuses new streams.");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{1} << 30,
          "Request and response payload bytes of all admitted calls "
          "together, held until each response has been sent; a call that "
          "would pass it is answered RESOURCE_EXHAUSTED at once. A call "
          "alone is always admitted.");
ABSL_FLAG(int64_t, max_inflight_bytes_per_connection, int64_t{512} << 20,
          "The same for the calls of one client connection, so that a "
          "client that never reads its responses cannot hold the whole "
          "--max_inflight_bytes.");
ABSL_FLAG(int32_t, fd_reserve, 256,
          "File descriptors kept free for the server's own use: a new "
          "connection is closed at once (attnserve_connections_refused_total) "
          "while fewer would stay free, so that a connection flood cannot "
          "reach the fd limit (at which gRPC 1.51 stops listening for good). "
          "The server raises its soft fd limit to the hard limit at start; "
          "connections are capped near that limit minus this. At most half "
          "the limit is reserved.");
ABSL_FLAG(int32_t, max_queue, 1024,
          "Requests that may wait for a worker; beyond it RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, model_repository, "",
          "Folder of named models (config.pbtxt + weights.safetensors each): "
          "additive-attention weights and fitted Nadaraya-Watson bandwidths, "
          "served over KServe and by name in the typed API. `make run` "
          "points it at deploy/models.");
ABSL_FLAG(bool, exit_on_model_error, true,
          "A model folder of --model_repository that fails to load at "
          "start-up stops the server (Triton's --exit-on-error), naming the "
          "file; false: the server starts without it, and the repository "
          "index lists it UNAVAILABLE with the reason. Leftovers of an "
          "interrupted save_as never count (docs/repository.md).");
ABSL_FLAG(std::string, model_control_mode, "none",
          "Live model control, as Triton's --model-control-mode: 'none' "
          "(the repository's models load at start-up and stay) or "
          "'explicit' (KServe RepositoryModelLoad / RepositoryModelUnload "
          "load, reload and unload them while serving; with "
          "--auth_tokens_file only tokens with the model_control "
          "permission may).");
ABSL_FLAG(bool, batching, false,
          "Batch concurrent requests of every operation with a batch "
          "dimension server-side (masked softmax, batch matmul, attention, "
          "additive attention, Nadaraya-Watson; ragged batching by padding). "
          "Off by default: on the CPU backend "
          "it measured ~10% slower (bench/batching_bench.sh; see README).");
ABSL_FLAG(int32_t, max_batch_size, 32,
          "Most requests one batch may hold.");
ABSL_FLAG(int64_t, max_batch_elements, int64_t{1} << 24,
          "Most padded input elements (queries + keys + values) of one batch; "
          "a larger single request runs alone.");
ABSL_FLAG(int32_t, max_queue_delay_us, 500,
          "How long the oldest queued request may wait for a batch to fill.");
ABSL_FLAG(std::vector<std::string>, preferred_batch_sizes, {},
          "Comma-separated batch sizes sent at once when reached, without "
          "waiting out --max_queue_delay_us (e.g. 8,16).");
ABSL_FLAG(int32_t, max_message_bytes, 256 << 20,
          "Largest request or response message in bytes (the default fits "
          "two 4096 x 4096 float32 tensors).");
ABSL_FLAG(int64_t, max_request_elements, int64_t{1} << 26,
          "Largest number of input elements of one request, all tensors "
          "together; beyond it RESOURCE_EXHAUSTED.");
namespace {

// Blocks SIGTERM and SIGINT in the calling thread. Called first thing in
// main, so every thread started later (gRPC's, OpenMP's) inherits the mask
// and the signals stay pending until WaitForTerminationSignal takes them.
void BlockTerminationSignals(sigset_t* signals) {
  sigemptyset(signals);
  sigaddset(signals, SIGTERM);
  sigaddset(signals, SIGINT);
  sigaddset(signals, SIGHUP);
  if (int err = pthread_sigmask(SIG_BLOCK, signals, nullptr); err != 0) {
    absl::FPrintF(stderr, "attnserve: pthread_sigmask: %s\n",
                  std::strerror(err));
    std::exit(1);
  }
}

// Blocks until SIGTERM or SIGINT arrives; returns its number. SIGHUP
// reloads the token file (if any) and goes on waiting.
int WaitForTerminationSignal(const sigset_t& signals,
                             attnserve::TokenStore* tokens) {
  while (true) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number != SIGHUP) return signal_number;
    if (tokens == nullptr) {
      absl::FPrintF(stderr, "attnserve: SIGHUP: nothing to reload\n");
    } else if (absl::Status reloaded = tokens->Reload(); reloaded.ok()) {
      absl::FPrintF(stderr, "attnserve: SIGHUP: reloaded %d tokens from %s\n",
                    tokens->size(), tokens->path());
    } else {
      absl::FPrintF(stderr, "attnserve: SIGHUP: %s; the previous tokens stay\n",
                    reloaded.message());
    }
  }
}

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

// The gRPC port's credentials from the TLS flags: insecure without
// --tls_cert, TLS with it, mutual TLS with --tls_client_ca as well.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (cert.empty()) {
    if (!client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert");
    }
    if (!absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
      return absl::InvalidArgumentError(
          "--auth_tokens_file needs --tls_cert: tokens sent in clear text "
          "are tokens given away");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(
      client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> pem = ReadPem("tls_key", key);
  if (!pem.ok()) return pem.status();
  pair.private_key = *std::move(pem);
  pem = ReadPem("tls_cert", cert);
  if (!pem.ok()) return pem.status();
  pair.cert_chain = *std::move(pem);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!client_ca.empty()) {
    pem = ReadPem("tls_client_ca", client_ca);
    if (!pem.ok()) return pem.status();
    options.pem_root_certs = *std::move(pem);
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so every Mutex acquisition
  // would update a global lock-order graph (GraphCycles, ~1.5% of the
  // server's CPU under streaming load). The tests keep the detection on; the
  // server runs code they have checked.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
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
  const int32_t drain_notice_ms = absl::GetFlag(FLAGS_drain_notice_ms);
  if (grace_period_ms < 0 || drain_notice_ms < 0) {
    absl::FPrintF(stderr,
                  "attnserve: --grace_period_ms=%d and --drain_notice_ms=%d "
                  "must not be negative\n",
                  grace_period_ms, drain_notice_ms);
    return 1;
  }

  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port);
  const int32_t max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (metrics_port < 0 || metrics_port > 65535 || max_message_bytes < 1 ||
      absl::GetFlag(FLAGS_max_request_elements) < 1 ||
      absl::GetFlag(FLAGS_kernel_threads) < 0 ||
      absl::GetFlag(FLAGS_worker_threads) < 0 ||
      absl::GetFlag(FLAGS_grpc_keepalive_time_ms) < 1 ||
      absl::GetFlag(FLAGS_grpc_keepalive_timeout_ms) < 1 ||
      absl::GetFlag(FLAGS_grpc_min_client_ping_interval_ms) < 0 ||
      absl::GetFlag(FLAGS_grpc_max_connection_age_ms) < 0 ||
      absl::GetFlag(FLAGS_grpc_max_connection_age_grace_ms) < 0 ||
      absl::GetFlag(FLAGS_grpc_max_connection_idle_ms) < 0 ||
      absl::GetFlag(FLAGS_grpc_handshake_timeout_ms) < 1 ||
      absl::GetFlag(FLAGS_grpc_max_concurrent_streams) < 1 ||
      absl::GetFlag(FLAGS_grpc_memory_quota_bytes) < (int64_t{1} << 20)) {
    absl::FPrintF(stderr,
                  "attnserve: --metrics_port must be in [0, 65535]; "
                  "--max_message_bytes and --max_request_elements at least 1; "
                  "--kernel_threads and --worker_threads not negative; "
                  "--grpc_keepalive_time_ms and --grpc_keepalive_timeout_ms "
                  "at least 1, the other --grpc_* times not negative; "
                  "--grpc_handshake_timeout_ms and "
                  "--grpc_max_concurrent_streams at least 1; "
                  "--grpc_memory_quota_bytes at least 1 MiB\n");
    return 1;
  }
  attnserve::Admission::Options admission_options;
  admission_options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  admission_options.max_inflight_bytes_per_peer =
      absl::GetFlag(FLAGS_max_inflight_bytes_per_connection);
  if (absl::Status valid = attnserve::Admission::Check(admission_options);
      !valid.ok()) {
    absl::FPrintF(stderr, "attnserve: %s\n", valid.message());
    return 1;
  }

  // Thread pools follow the CPUs the process may really use (a container's
  // quota, not the node's cores); flags still override.
  const attnserve::CpuBudget cpu_budget = attnserve::DetectCpuBudget();
  attn::EngineOptions engine_options;
  engine_options.max_threads = absl::GetFlag(FLAGS_kernel_threads) > 0
                                   ? absl::GetFlag(FLAGS_kernel_threads)
                                   : cpu_budget.cpus;
  const std::string backend_flag = absl::GetFlag(FLAGS_backend);
  if (backend_flag == "cpu") {
    engine_options.device = attn::Device::kCpu;
  } else if (backend_flag == "cuda") {
    engine_options.device = attn::Device::kCuda;
  } else if (backend_flag == "auto") {
    engine_options.device = attn::Device::kAuto;
  } else {
    absl::FPrintF(stderr,
                  "attnserve: --backend must be cpu, cuda or auto, got \"%s\"\n",
                  backend_flag);
    return 1;
  }
  engine_options.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  engine_options.cuda_min_flops = absl::GetFlag(FLAGS_cuda_min_flops);
  if (!(engine_options.cuda_min_flops >= 0)) {
    absl::FPrintF(stderr, "attnserve: --cuda_min_flops must be >= 0, got %g\n",
                  engine_options.cuda_min_flops);
    return 1;
  }
  if (const std::string isa = absl::GetFlag(FLAGS_max_cpu_isa); isa != "auto") {
    absl::StatusOr<attn::CpuIsa> cap = attn::ParseCpuIsa(isa);
    if (!cap.ok()) {
      absl::FPrintF(stderr, "attnserve: --max_cpu_isa: %s (or auto)\n",
                    cap.status().message());
      return 1;
    }
    engine_options.max_cpu_isa = *cap;
  }
  absl::StatusOr<std::unique_ptr<attn::Engine>> engine =
      attn::Engine::Create(engine_options);
  if (!engine.ok()) {
    absl::FPrintF(stderr, "attnserve: creating the engine: %s\n",
                  engine.status().ToString());
    return 1;
  }
  if (absl::Status warm = (*engine)->WarmUp(); !warm.ok()) {
    absl::FPrintF(stderr, "attnserve: warming up the kernels: %s\n",
                  warm.ToString());
    return 1;
  }
  for (const std::string& note : engine.value()->notes()) {
    absl::FPrintF(stderr, "attnserve: %s\n", note);
  }
  const std::vector<std::string> backends = engine.value()->backend_names();
  const std::vector<std::string> descriptions =
      engine.value()->backend_descriptions();
  for (size_t i = 0; i < backends.size(); ++i) {
    absl::FPrintF(stderr, "attnserve: backend %d of %d: %s\n", i + 1,
                  backends.size(), descriptions[i]);
  }

  attnserve::ServerCore::Options core_options;
  core_options.workers.threads = absl::GetFlag(FLAGS_worker_threads) > 0
                                     ? absl::GetFlag(FLAGS_worker_threads)
                                     : cpu_budget.cpus;
  core_options.workers.max_queue = absl::GetFlag(FLAGS_max_queue);
  core_options.admission = admission_options;
  core_options.return_memory_when_idle = true;
  absl::FPrintF(stderr,
                "attnserve: CPU budget %d (%s); --worker_threads=%d: %d "
                "worker threads; --kernel_threads=%d: up to %d OpenMP "
                "threads per call\n",
                cpu_budget.cpus, cpu_budget.reason,
                absl::GetFlag(FLAGS_worker_threads),
                core_options.workers.threads,
                absl::GetFlag(FLAGS_kernel_threads), engine_options.max_threads);

  // Before any listener opens (server/core/accept_guard.h).
  absl::StatusOr<attnserve::FdLimit> fd_limit = attnserve::RaiseFdLimit();
  if (!fd_limit.ok()) {
    absl::FPrintF(stderr, "attnserve: %s\n", fd_limit.status().ToString());
    return 1;
  }
  const int fd_reserve =
      attnserve::InstallAcceptGuard(absl::GetFlag(FLAGS_fd_reserve));
  absl::FPrintF(stderr,
                "attnserve: file descriptors: soft limit %d -> %d (the hard "
                "limit); new connections refused while fewer than %d would "
                "stay free (--fd_reserve)\n",
                fd_limit->soft_before, fd_limit->soft, fd_reserve);

  if (absl::GetFlag(FLAGS_batching)) {
    attnserve::BatchingOptions batching;
    batching.max_batch_requests = absl::GetFlag(FLAGS_max_batch_size);
    batching.max_batch_elements = absl::GetFlag(FLAGS_max_batch_elements);
    batching.max_queue_delay =
        absl::Microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
    batching.max_queue_size = absl::GetFlag(FLAGS_max_queue);
    for (const std::string& size : absl::GetFlag(FLAGS_preferred_batch_sizes)) {
      int value = 0;
      if (!absl::SimpleAtoi(size, &value)) {
        absl::FPrintF(stderr,
                      "attnserve: --preferred_batch_sizes: '%s' is not an "
                      "integer\n",
                      size);
        return 1;
      }
      batching.preferred_batch_sizes.push_back(value);
    }
    core_options.batching = batching;
  }
  // The limits that depend on the token file are set once it is read.
  core_options.limits.max_request_elements =
      absl::GetFlag(FLAGS_max_request_elements);
  core_options.limits.max_response_bytes = max_message_bytes;
  core_options.limits.save_as_needs_permission =
      !absl::GetFlag(FLAGS_auth_tokens_file).empty();
  absl::StatusOr<std::unique_ptr<attnserve::ServerCore>> core =
      attnserve::ServerCore::Create(core_options, *std::move(engine));
  if (!core.ok()) {
    absl::FPrintF(stderr, "attnserve: %s\n", core.status().ToString());
    return 1;
  }

  // After the queue-depth source is set: a scrape may come at once.
  // civetweb (behind prometheus-cpp's Exposer) throws when it cannot bind.
  std::unique_ptr<prometheus::Exposer> exposer;
  constexpr int kMetricsThreads = 256;
  const std::string metrics_host = absl::GetFlag(FLAGS_metrics_host).empty()
                                       ? host
                                       : absl::GetFlag(FLAGS_metrics_host);
  const std::string metrics_address =
      absl::StrCat(metrics_host, ":", metrics_port);
  try {
    // civetweb gives each connection a worker thread until its request is
    // read, or request_timeout_ms passes from the request's start (civetweb
    // 1.15 read_message: a slow client is dropped after 1-2 x the timeout
    // however often it sends a byte); accepted connections beyond the
    // workers wait in a queue, then in the kernel's backlog. With
    // prometheus-cpp's 2 threads and civetweb's 30 s, two half-sent
    // requests silenced /metrics for 30 s; with 16 threads and 10 s, 500
    // slow clients silenced it until they left. A scrape is one short
    // request on loopback or the pod network, so 1 s is ample, and
    // kMetricsThreads workers (idle threads cost no CPU and little
    // memory) take hundreds of slow clients at once: tests/faults scrape.
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", metrics_address,
        "num_threads", std::to_string(kMetricsThreads),
        "request_timeout_ms", "1000",
        "connection_queue", "256",
        "listen_backlog", "1024",
        "max_request_size", "8192"});
  } catch (const std::exception& e) {
    absl::FPrintF(stderr, "attnserve: cannot serve metrics on %s: %s\n",
                  metrics_address, e.what());
    return 1;
  }
  exposer->RegisterCollectable((*core)->metrics().registry());
  exposer->RegisterCollectable((*core)->metrics().sampled());
  const std::vector<int> metrics_ports = exposer->GetListeningPorts();

  const std::string model_control_mode = absl::GetFlag(FLAGS_model_control_mode);
  if (model_control_mode != "none" && model_control_mode != "explicit") {
    absl::FPrintF(stderr,
                  "attnserve: --model_control_mode: '%s' is neither 'none' "
                  "nor 'explicit'\n",
                  model_control_mode);
    return 1;
  }
  attnserve::ModelRepository::Options repository_options;
  repository_options.dir = absl::GetFlag(FLAGS_model_repository);
  repository_options.fail_on_model_error =
      absl::GetFlag(FLAGS_exit_on_model_error);
  absl::StatusOr<std::unique_ptr<attnserve::ModelRepository>> repository =
      attnserve::ModelRepository::Load(repository_options);
  if (!repository.ok()) {
    absl::FPrintF(stderr, "attnserve: %s\n", repository.status().ToString());
    return 1;
  }
  for (const std::string& name : (*repository)->Names()) {
    absl::FPrintF(stderr, "attnserve: model repository: %s\n", name);
  }

  // Transport security and tokens, all checked before the port opens.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentials();
  if (!credentials.ok()) {
    absl::FPrintF(stderr, "attnserve: %s\n", credentials.status().message());
    return 1;
  }
  std::unique_ptr<attnserve::TokenStore> tokens;
  if (const std::string path = absl::GetFlag(FLAGS_auth_tokens_file);
      !path.empty()) {
    absl::StatusOr<std::unique_ptr<attnserve::TokenStore>> loaded =
        attnserve::TokenStore::Load(path);
    if (!loaded.ok()) {
      absl::FPrintF(stderr, "attnserve: %s\n", loaded.status().message());
      return 1;
    }
    tokens = *std::move(loaded);
    (*credentials)->SetAuthMetadataProcessor(
        std::make_shared<attnserve::TokenAuthProcessor>(
            tokens.get(), [raw = &(*core)->metrics()](attnserve::AuthFailure why) {
              raw->Unauthenticated(why == attnserve::AuthFailure::kMissingToken);
            }));
    absl::FPrintF(stderr,
                  "attnserve: token authentication: %d tokens from %s "
                  "(health checks stay open; SIGHUP or an edit reloads)\n",
                  tokens->size(), path);
  }
  absl::FPrintF(stderr, "attnserve: gRPC transport: %s\n",
                absl::GetFlag(FLAGS_tls_cert).empty()
                    ? "plaintext"
                    : (absl::GetFlag(FLAGS_tls_client_ca).empty()
                           ? "TLS"
                           : "mutual TLS (client certificates required)"));
  // The two APIs in front of the serving core.
  attnserve::CallRunner& calls = (*core)->calls();
  attnserve::AttentionService service(&calls, repository->get());
  attnserve::ModelControl model_control;
  model_control.explicit_mode = model_control_mode == "explicit";
  model_control.needs_permission = tokens != nullptr;
  attnserve::InferenceService inference(
      &calls, repository->get(), (*core)->batching(),
      absl::GetFlag(FLAGS_max_batch_size), model_control);

  grpc::EnableDefaultHealthCheckService(true);
  if (absl::GetFlag(FLAGS_reflection)) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }

  const std::string address = absl::StrCat(host, ":", port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, so a second attnserve on a busy port
  // would start and silently share it; fail at boot instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Connection management (see the flags): keepalive finds dead peers; a
  // bounded connection age makes long-lived clients rebalance across
  // replicas behind L4 load balancers.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             absl::GetFlag(FLAGS_grpc_keepalive_time_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             absl::GetFlag(FLAGS_grpc_keepalive_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      absl::GetFlag(FLAGS_grpc_min_client_ping_interval_ms));
  if (absl::GetFlag(FLAGS_grpc_max_connection_age_ms) > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               absl::GetFlag(FLAGS_grpc_max_connection_age_ms));
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
        absl::GetFlag(FLAGS_grpc_max_connection_age_grace_ms));
  }
  if (absl::GetFlag(FLAGS_grpc_max_connection_idle_ms) > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               absl::GetFlag(FLAGS_grpc_max_connection_idle_ms));
  }
  // What the transport may hold before a call reaches the service's own
  // admission (server/core/admission.h): streams per connection, handshakes,
  // and the memory of requests still being received.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             absl::GetFlag(FLAGS_grpc_handshake_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_grpc_max_concurrent_streams));
  grpc::ResourceQuota quota("attnserve");
  quota.Resize(static_cast<size_t>(absl::GetFlag(FLAGS_grpc_memory_quota_bytes)));
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(address, *credentials, &bound_port);
  builder.RegisterService(&service);
  builder.RegisterService(&inference);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    absl::FPrintF(stderr, "attnserve: cannot listen on %s\n", address);
    return 1;
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("attention.v1.AttentionService", true);
  health->SetServingStatus("inference.GRPCInferenceService", true);
  absl::FPrintF(stderr, "attnserve: metrics on http://%s:%d/metrics\n", metrics_host,
                metrics_ports.empty() ? 0 : metrics_ports.front());
  absl::FPrintF(stderr, "attnserve listening on %s:%d\n", host, bound_port);

  // An edited token file takes effect without a signal too: polled every
  // second (cheap: one stat()).
  absl::Notification stop_token_watch;
  std::thread token_watch;
  if (tokens != nullptr) {
    token_watch = std::thread([&stop_token_watch, raw = tokens.get()] {
      while (!stop_token_watch.WaitForNotificationWithTimeout(
          absl::Seconds(1))) {
        absl::StatusOr<bool> reloaded = raw->ReloadIfChanged();
        if (!reloaded.ok()) {
          absl::FPrintF(stderr,
                        "attnserve: token file changed: %s; the previous "
                        "tokens stay\n",
                        reloaded.status().message());
        } else if (*reloaded) {
          absl::FPrintF(stderr,
                        "attnserve: token file changed: reloaded %d tokens\n",
                        raw->size());
        }
      }
    });
  }

  const int signal_number =
      WaitForTerminationSignal(termination_signals, tokens.get());
  if (token_watch.joinable()) {
    stop_token_watch.Notify();
    token_watch.join();
  }
  absl::FPrintF(stderr,
                "attnserve: %s received; NOT_SERVING for %d ms, then "
                "draining for up to %d ms\n",
                signal_number == SIGTERM ? "SIGTERM" : "SIGINT",
                drain_notice_ms, grace_period_ms);
  health->SetServingStatus(false);
  inference.SetReady(false);
  absl::SleepFor(absl::Milliseconds(drain_notice_ms));
  // The drain. gRPC's own Server::Shutdown is not used: it cancels (as
  // CANCELLED, which no client retries) every call whose request is still
  // arriving, and a client cannot tell that from its own cancellation. So
  // the service itself refuses what arrives from now on with UNAVAILABLE
  // (not started; retry elsewhere), waits until every call it accepted has
  // been answered and its response sent (admission tickets are held until
  // gRPC is done with a call), and the process then exits; a call still in
  // transit sees its connection close: UNAVAILABLE too.
  const absl::Time drain_started = absl::Now();
  const int64_t accepted = (*core)->admission().inflight_calls();
  (*core)->StartDraining();
  const bool drained =
      (*core)->WaitUntilIdle(drain_started + absl::Milliseconds(grace_period_ms));
  if (drained) {
    // Responses handed to the sockets are on their way; give the clients a
    // moment to read them before the sockets close.
    absl::SleepFor(absl::Milliseconds(100));
    absl::FPrintF(stderr,
                  "attnserve: drained: the %d calls in flight were answered "
                  "in %s; stopped\n",
                  accepted, absl::FormatDuration(absl::Now() - drain_started));
  } else {
    // Past the grace period: the calls still running get UNAVAILABLE as
    // their connections close (a kernel cannot be interrupted).
    absl::FPrintF(stderr,
                  "attnserve: grace period over with %d calls unanswered "
                  "(kernels still running or responses not read); stopped, "
                  "abandoning them\n",
                  (*core)->admission().inflight_calls());
  }
  // Exit without destructors: an abandoned kernel may still be running, and
  // the metrics exposer's web server takes ~2 s to stop; nothing is left to
  // flush but stdio.
  std::fflush(nullptr);
  std::_Exit(0);
}
