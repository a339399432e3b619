// attnserve's flags, read in one place: every flag of the server is defined
// here and becomes part of a ServerConfig (server/flags.h); nothing else in
// the server reads a flag (the library and the core take Options).
#include "server/flags.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "attn/cpu_isa.h"
#include "attn/held_memory.h"
#include "attn/minimum_work_backend.h"

ABSL_FLAG(std::string, backend, "auto",
          "Where kernels run: cpu (oneDNN), cuda (the GPU; start-up fails "
          "without a usable one), or auto (the GPU when one is usable, else "
          "the CPU; start-up says which and why).");
ABSL_FLAG(std::string, max_cpu_isa, "auto",
          "Highest instruction set for attnserve's own CPU kernels: auto (the "
          "best this CPU has), amx (AVX-512 and AMX tiles), avx512 (the tiles "
          "off), avx2 or baseline. Every value gives "
          "results within the same documented bounds; lower ones pin a fleet "
          "of mixed "
          "CPUs to one code path. oneDNN's own kernels follow "
          "ONEDNN_MAX_CPU_ISA; start-up logs both.");
ABSL_FLAG(int32_t, cuda_device, 0, "The GPU's CUDA ordinal (--backend=cuda|auto).");
ABSL_FLAG(double, cuda_min_flops, 4e6,
          "With a GPU (--backend=cuda|auto), calls estimated at fewer "
          "floating-point operations than this run on the CPU: a GPU call "
          "pays a fixed round trip (copies, launches, a synchronisation) that "
          "a small call does not repay. 0 sends the GPU every call it takes. "
          "The default is the crossover measured on an H100 beside a 16-core "
          "Xeon (3.9e6, Nadaraya-Watson's; attention's was 1.7e7); "
          "bench/cuda_crossover_bench measures it on the node.");
ABSL_FLAG(std::vector<std::string>, cuda_min_flops_by_operation,
          std::vector<std::string>({"masked_softmax=never", "batch_matmul=never"}),
          "Per-operation exceptions to --cuda_min_flops, as operation=flops "
          "or operation=never (that operation always runs on the CPU); "
          "operations: masked_softmax, batch_matmul, attention, "
          "additive_attention, nadaraya_watson. The default keeps masked "
          "softmax and batch matmul on the CPU: on an H100 beside a 16-core "
          "Xeon they never won on the GPU at any size measured "
          "(bench/cuda_crossover_bench). Calls on stored memories held on "
          "the GPU take no threshold unless attention is 'never'.");
ABSL_FLAG(int64_t, cuda_held_memory_bytes, 0,
          "With a GPU, the device memory that stored memories' keys and "
          "values may hold between calls (each is copied there at its first "
          "call; the least recently used goes first when a new one needs "
          "room; one that cannot fit runs on the CPU, and the log and "
          "/metrics say so). 0: half of the GPU's memory.");
ABSL_FLAG(int32_t, grpc_port, 8001,
          "TCP port for gRPC; 0 picks a free port (logged at startup).");
ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address to bind gRPC to, e.g. 0.0.0.0, 127.0.0.1 or [::].");
ABSL_FLAG(int32_t, http_port, 8000,
          "TCP port for KServe v2 over HTTP/REST (Triton's default); 0 turns "
          "the HTTP front end off. Same limits, drain, TLS and tokens as the "
          "gRPC port.");
ABSL_FLAG(std::string, http_host, "",
          "Address to bind the HTTP port to; empty means --host.");
ABSL_FLAG(int32_t, http_threads, 1,
          "Event loops of the HTTP port (each reads, parses and routes "
          "requests; kernels run on the worker pool either way).");
ABSL_FLAG(int32_t, http_max_connections, 1000,
          "Open HTTP connections at most; a connection over it is closed at "
          "once and counted in attnserve_connections_refused_total.");
ABSL_FLAG(int32_t, http_request_timeout_ms, 30000,
          "An HTTP request must arrive whole within this of its connection "
          "opening or of the previous response (slow clients); idle "
          "keep-alive connections, and connections that neither read nor "
          "write for this long, are closed.");
ABSL_FLAG(int32_t, http_max_header_bytes, 16384,
          "Largest HTTP request head (request line and headers); beyond it "
          "the connection is refused (400).");
ABSL_FLAG(std::string, metrics_host, "",
          "Address to bind the metrics endpoint to; empty means --host. "
          "The endpoint is plain HTTP without authentication: bind it to "
          "127.0.0.1 or a private interface when the gRPC port is public.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC and HTTP ports; with --tls_key, "
          "both speak TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: with it, clients must present a certificate signed "
          "by one of these CAs (mutual TLS). Needs --tls_cert.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of bearer tokens (one per line, optionally followed by the "
          "permissions save_as and model_control; see server/transport/auth.h). "
          "Every call but health checks, on the gRPC and HTTP ports, then "
          "needs `authorization: Bearer <token>`. Reloaded on "
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
ABSL_FLAG(int32_t, stored_memory_threads, 0,
          "OpenMP threads a batch of calls on a stored memory may use; such "
          "batches then run one at a time, their work one pass over the "
          "memory shared out among the threads. 0 (the default) means the "
          "CPU budget; 1 runs them as any call (--kernel_threads), one per "
          "worker. Only where the kernels run on the CPU.");
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
          "additive-attention weights, fitted Nadaraya-Watson models and "
          "attention memories, served over KServe and by name in the typed "
          "API. `make run` points it at deploy/models.");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{2} << 30,
          "Largest weights.safetensors a model of --model_repository may "
          "hold: a bigger one is refused (RESOURCE_EXHAUSTED naming the "
          "file) when loaded, saved or uploaded, before it is read. An "
          "upload is also one message, within --max_message_bytes.");
ABSL_FLAG(int64_t, max_grown_model_bytes, 0,
          "The most a model of --model_repository may grow to by appends "
          "(AppendMemory): its weights.safetensors and rows files together. "
          "An append past it is refused (RESOURCE_EXHAUSTED). Appends are "
          "not one message, so this may be far above --max_model_bytes. "
          "0: half the machine's memory.");
ABSL_FLAG(bool, compact_rows, true,
          "Fold a grown model's rows files and eviction records into one "
          "base file in the background, while it serves, once they hold as "
          "many bytes as the file its rows start from (or number 4,096), or "
          "once the rows evicted hold half of its files: a restart then "
          "reads few files, and evicted rows leave the disk "
          "(docs/repository.md#compaction).");
ABSL_FLAG(bool, map_model_weights, true,
          "Serve each weights.safetensors of --model_repository mapped from "
          "the file under a read lease, not read into the server's memory: "
          "no copy at load, and one copy in RAM for every replica on the "
          "machine. A file changed in place is copied before the change "
          "lands; where a lease is refused (NFS, a file the server does not "
          "own) the file is read, and logged (docs/repository.md). The rows "
          "appended (AppendMemory) are likewise kept in scratch files of the "
          "model's folder, mapped. false: every model is read, and the rows "
          "appended held in the server's memory.");
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
          "it measured ~10% slower (bench/batching_bench.sh; see docs/batching.md).");
ABSL_FLAG(bool, batch_stored_memories, true,
          "Without --batching: batch the calls on stored memories (models of "
          "backend attention_memory) alone, whose queries a batch stacks into "
          "one pass over the memory (4.2-9.2x the throughput from 65,536 "
          "entries on the CPU, docs/batching.md); the other calls run alone. "
          "false: they run alone too.");
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

namespace attnserve {

absl::StatusOr<ServerConfig> ServerConfigFromFlags() {
  ServerConfig config;
  GrpcServerOptions& grpc = config.grpc;
  grpc.port = absl::GetFlag(FLAGS_grpc_port);
  grpc.host = absl::GetFlag(FLAGS_host);
  if (grpc.port < 0 || grpc.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc_port=", grpc.port, " is not in [0, 65535]"));
  }
  const int32_t drain_notice_ms = absl::GetFlag(FLAGS_drain_notice_ms);
  const int32_t grace_period_ms = absl::GetFlag(FLAGS_grace_period_ms);
  if (grace_period_ms < 0 || drain_notice_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--grace_period_ms=", grace_period_ms, " and --drain_notice_ms=",
        drain_notice_ms, " must not be negative"));
  }
  config.drain_notice = absl::Milliseconds(drain_notice_ms);
  config.grace_period = absl::Milliseconds(grace_period_ms);

  config.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  config.metrics_host = absl::GetFlag(FLAGS_metrics_host).empty()
                            ? grpc.host
                            : absl::GetFlag(FLAGS_metrics_host);
  grpc.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  grpc.keepalive_time_ms = absl::GetFlag(FLAGS_grpc_keepalive_time_ms);
  grpc.keepalive_timeout_ms = absl::GetFlag(FLAGS_grpc_keepalive_timeout_ms);
  grpc.min_client_ping_interval_ms =
      absl::GetFlag(FLAGS_grpc_min_client_ping_interval_ms);
  grpc.max_connection_age_ms = absl::GetFlag(FLAGS_grpc_max_connection_age_ms);
  grpc.max_connection_age_grace_ms =
      absl::GetFlag(FLAGS_grpc_max_connection_age_grace_ms);
  grpc.max_connection_idle_ms = absl::GetFlag(FLAGS_grpc_max_connection_idle_ms);
  grpc.handshake_timeout_ms = absl::GetFlag(FLAGS_grpc_handshake_timeout_ms);
  grpc.max_concurrent_streams = absl::GetFlag(FLAGS_grpc_max_concurrent_streams);
  grpc.memory_quota_bytes = absl::GetFlag(FLAGS_grpc_memory_quota_bytes);
  if (config.metrics_port < 0 || config.metrics_port > 65535 ||
      grpc.max_message_bytes < 1 ||
      absl::GetFlag(FLAGS_max_request_elements) < 1 ||
      absl::GetFlag(FLAGS_kernel_threads) < 0 ||
      absl::GetFlag(FLAGS_worker_threads) < 0 ||
      absl::GetFlag(FLAGS_stored_memory_threads) < 0 ||
      grpc.keepalive_time_ms < 1 || grpc.keepalive_timeout_ms < 1 ||
      grpc.min_client_ping_interval_ms < 0 || grpc.max_connection_age_ms < 0 ||
      grpc.max_connection_age_grace_ms < 0 || grpc.max_connection_idle_ms < 0 ||
      grpc.handshake_timeout_ms < 1 || grpc.max_concurrent_streams < 1 ||
      grpc.memory_quota_bytes < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        "--metrics_port must be in [0, 65535]; "
        "--max_message_bytes and --max_request_elements at least 1; "
        "--kernel_threads, --worker_threads and --stored_memory_threads not "
        "negative; "
        "--grpc_keepalive_time_ms and --grpc_keepalive_timeout_ms "
        "at least 1, the other --grpc_* times not negative; "
        "--grpc_handshake_timeout_ms and "
        "--grpc_max_concurrent_streams at least 1; "
        "--grpc_memory_quota_bytes at least 1 MiB");
  }
  grpc.reflection = absl::GetFlag(FLAGS_reflection);
  grpc.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  grpc.tls_key = absl::GetFlag(FLAGS_tls_key);
  grpc.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  config.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  // Before the certificates and the token file are read (at start-up,
  // where the transports check them again).
  if (grpc.tls_cert.empty() != grpc.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (grpc.tls_cert.empty() && !grpc.tls_client_ca.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert");
  }
  if (grpc.tls_cert.empty() && !config.auth_tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth_tokens_file needs --tls_cert: tokens sent in clear text "
        "are tokens given away");
  }
  config.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  const std::string model_control_mode = absl::GetFlag(FLAGS_model_control_mode);
  if (model_control_mode != "none" && model_control_mode != "explicit") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_control_mode: '", model_control_mode,
                     "' is neither 'none' nor 'explicit'"));
  }
  config.explicit_model_control = model_control_mode == "explicit";

  HttpServerOptions& http = config.http;
  http.port = absl::GetFlag(FLAGS_http_port);
  http.host = absl::GetFlag(FLAGS_http_host).empty()
                  ? grpc.host
                  : absl::GetFlag(FLAGS_http_host);
  http.threads = absl::GetFlag(FLAGS_http_threads);
  http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  http.max_header_bytes = absl::GetFlag(FLAGS_http_max_header_bytes);
  const int32_t http_request_timeout_ms =
      absl::GetFlag(FLAGS_http_request_timeout_ms);
  if (http.port < 0 || http.port > 65535 || http.threads < 1 ||
      http.max_connections < 1 || http.max_header_bytes < 1024 ||
      http_request_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        "--http_port must be in [0, 65535]; --http_threads, "
        "--http_max_connections and --http_request_timeout_ms at least 1; "
        "--http_max_header_bytes at least 1024");
  }
  http.request_timeout = absl::Milliseconds(http_request_timeout_ms);
  http.max_body_bytes = grpc.max_message_bytes;
  http.tls_cert = grpc.tls_cert;
  http.tls_key = grpc.tls_key;
  http.tls_client_ca = grpc.tls_client_ca;

  ExecutionStack::Options& core = config.core;
  core.admission.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  core.admission.max_inflight_bytes_per_peer =
      absl::GetFlag(FLAGS_max_inflight_bytes_per_connection);
  if (absl::Status valid = Admission::Check(core.admission); !valid.ok()) {
    return valid;
  }

  // Thread pools follow the CPUs the process may really use (a container's
  // quota, not the node's cores); flags still override.
  const CpuBudget cpu_budget = DetectCpuBudget();
  attn::EngineOptions& engine = config.engine;
  engine.max_threads = absl::GetFlag(FLAGS_kernel_threads) > 0
                           ? absl::GetFlag(FLAGS_kernel_threads)
                           : cpu_budget.cpus;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cpu") {
    engine.device = attn::Device::kCpu;
  } else if (backend == "cuda") {
    engine.device = attn::Device::kCuda;
  } else if (backend == "auto") {
    engine.device = attn::Device::kAuto;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend must be cpu, cuda or auto, got \"", backend, "\""));
  }
  engine.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  const double min_flops = absl::GetFlag(FLAGS_cuda_min_flops);
  if (!(min_flops >= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cuda_min_flops must be >= 0, got %g", min_flops));
  }
  engine.cuda_min_work = attn::MinimumWork::All(min_flops);
  for (const std::string& entry :
       absl::GetFlag(FLAGS_cuda_min_flops_by_operation)) {
    if (entry.empty()) continue;
    const std::vector<std::string> parts = absl::StrSplit(entry, '=');
    double flops = 0;
    const bool never = parts.size() == 2 && parts[1] == "never";
    if (parts.size() != 2 ||
        (!never && (!absl::SimpleAtod(parts[1], &flops) || !(flops >= 0) ||
                    std::isinf(flops)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cuda_min_flops_by_operation: '", entry,
          "' is not operation=flops (a number >= 0) or operation=never"));
    }
    if (never) flops = attn::MinimumWork::kNever;
    double* threshold = engine.cuda_min_work.Find(parts[0]);
    if (threshold == nullptr) {
      std::vector<std::string> known;
      for (const auto& [name, unused] : attn::kMinimumWorkOperations) {
        known.push_back(name);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "--cuda_min_flops_by_operation: unknown operation '", parts[0],
          "' (", absl::StrJoin(known, ", "), ")"));
    }
    *threshold = flops;
  }
  engine.cuda_held_memory_bytes = absl::GetFlag(FLAGS_cuda_held_memory_bytes);
  if (engine.cuda_held_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda_held_memory_bytes must be >= 0 (0: half of the GPU's "
        "memory), got ",
        engine.cuda_held_memory_bytes));
  }
  engine.on_held_memory_event = [](const attn::HeldMemoryEvent& event) {
    absl::FPrintF(stderr, "attnserve: GPU: memory '%s' (%.1f MiB) %s%s%s\n",
                  event.label, event.bytes / 1048576.0,
                  attn::HeldMemoryEventName(event.kind),
                  event.kind == attn::HeldMemoryEvent::Kind::kRefused
                      ? ", its calls run on the CPU: "
                      : "",
                  event.reason);
  };
  if (const std::string isa = absl::GetFlag(FLAGS_max_cpu_isa); isa != "auto") {
    absl::StatusOr<attn::CpuIsa> cap = attn::ParseCpuIsa(isa);
    if (!cap.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max_cpu_isa: ", cap.status().message(), " (or auto)"));
    }
    engine.max_cpu_isa = *cap;
  }

  core.workers.threads = absl::GetFlag(FLAGS_worker_threads) > 0
                             ? absl::GetFlag(FLAGS_worker_threads)
                             : cpu_budget.cpus;
  core.workers.max_queue = absl::GetFlag(FLAGS_max_queue);
  config.threads_note = absl::StrFormat(
      "CPU budget %d (%s); --worker_threads=%d: %d worker threads; "
      "--kernel_threads=%d: up to %d OpenMP threads per call",
      cpu_budget.cpus, cpu_budget.reason, absl::GetFlag(FLAGS_worker_threads),
      core.workers.threads, absl::GetFlag(FLAGS_kernel_threads),
      engine.max_threads);
  if (absl::GetFlag(FLAGS_batching) ||
      absl::GetFlag(FLAGS_batch_stored_memories)) {
    BatchingOptions batching;
    batching.max_batch_requests = absl::GetFlag(FLAGS_max_batch_size);
    batching.max_batch_elements = absl::GetFlag(FLAGS_max_batch_elements);
    batching.max_queue_delay =
        absl::Microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
    batching.max_queue_size = absl::GetFlag(FLAGS_max_queue);
    for (const std::string& size : absl::GetFlag(FLAGS_preferred_batch_sizes)) {
      int value = 0;
      if (!absl::SimpleAtoi(size, &value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--preferred_batch_sizes: '", size, "' is not an integer"));
      }
      batching.preferred_batch_sizes.push_back(value);
    }
    if (absl::GetFlag(FLAGS_batching)) {
      core.batching = batching;
    } else {
      core.gainful_batching = batching;
    }
    const int memory_threads = absl::GetFlag(FLAGS_stored_memory_threads) > 0
                                   ? absl::GetFlag(FLAGS_stored_memory_threads)
                                   : cpu_budget.cpus;
    if (engine.device != attn::Device::kCuda &&
        memory_threads > engine.max_threads) {
      config.wide_engine = engine;
      config.wide_engine->device = attn::Device::kCpu;
      config.wide_engine->max_threads = memory_threads;
      absl::StrAppend(&config.threads_note, "; --stored_memory_threads=",
                      absl::GetFlag(FLAGS_stored_memory_threads), ": a ",
                      "stored memory's batches one at a time, up to ",
                      memory_threads, " OpenMP threads each");
    }
  }
  core.limits.max_request_elements = absl::GetFlag(FLAGS_max_request_elements);
  core.limits.max_response_bytes = grpc.max_message_bytes;
  core.return_memory_when_idle = true;

  config.fd_reserve = absl::GetFlag(FLAGS_fd_reserve);
  config.repository.dir = absl::GetFlag(FLAGS_model_repository);
  config.repository.fail_on_model_error =
      absl::GetFlag(FLAGS_exit_on_model_error);
  config.repository.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  config.repository.map_weights = absl::GetFlag(FLAGS_map_model_weights);
  config.repository.compaction.in_background =
      absl::GetFlag(FLAGS_compact_rows);
  if (config.repository.max_model_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_model_bytes must be at least 1, got ",
        config.repository.max_model_bytes));
  }
  config.repository.max_grown_model_bytes =
      absl::GetFlag(FLAGS_max_grown_model_bytes);
  if (config.repository.max_grown_model_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_grown_model_bytes must be 0 (half the machine's memory) or "
        "more, got ",
        config.repository.max_grown_model_bytes));
  }
  if (config.repository.max_grown_model_bytes == 0) {
    // A grown model is served from page cache (its rows mapped) or the
    // server's memory; half leaves room for the rest of the process and
    // the other models, so that a memory queried whole stays in RAM.
    config.repository.max_grown_model_bytes =
        std::max<int64_t>(config.repository.max_model_bytes,
                          static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
                              sysconf(_SC_PAGESIZE) / 2);
  }
  return config;
}

}  // namespace attnserve
