// attnserve: the gRPC and HTTP front of the attention kernel library.
//
// Serves attention.v1.AttentionService, the KServe v2 / Triton-compatible
// inference.GRPCInferenceService, the standard grpc.health.v1.Health
// service (SERVING once ready, NOT_SERVING while draining) and server
// reflection on --grpc_port (server/transport/grpc_server.h), KServe v2 over
// HTTP/REST on --http_port (server/transport/http_server.h), and Prometheus
// metrics at http://--metrics_host:--metrics_port/metrics. Everything that
// can fail (flags, engine, metric families, ports, certificates, tokens,
// models) fails at boot, not on a request.
//
// The start, in order: flags -> ServerConfig (server/flags.h) -> the
// engines, warmed up (server/engines.h) -> the fd limit and the accept guard
// (server/process/accept_guard.h) -> the execution stack
// (server/execution/execution_stack.h) -> metrics -> the model repository ->
// the token store and the catalogue of models, one each, lent to every
// front end -> the front ends (server/typed/, server/kserve/) -> the gRPC
// server -> the HTTP server (server/transport/). Then it waits for a signal
// (server/signals.h).
//
// Lifecycle: SIGTERM or SIGINT flips health to NOT_SERVING but keeps
// serving for --drain_notice_ms; then new calls are refused with
// UNAVAILABLE, accepted ones finish for up to --grace_period_ms, and the
// process exits 0. SIGHUP reloads the token file. Startup failures exit 1.
//
// Logging: one line per event to stderr through absl::FPrintF (Abseil
// 20220623 has no absl/log).

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attn/engine.h"
#include "server/process/accept_guard.h"
#include "server/execution/execution_stack.h"
#include "server/engines.h"
#include "server/flags.h"
#include "server/kserve/inference_service.h"
#include "server/kserve/rest_service.h"
#include "server/metrics_endpoint.h"
#include "server/models/model_catalogue.h"
#include "server/repository/model_repository.h"
#include "server/signals.h"
#include "server/transport/auth.h"
#include "server/transport/grpc_server.h"
#include "server/transport/http_server.h"
#include "server/typed/attention_service.h"

namespace {

// Prints why the start failed; main returns its value (exit status 1).
int Fail(const absl::Status& status) {
  absl::FPrintF(stderr, "attnserve: %s\n", status.message());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so every Mutex acquisition
  // would update a global lock-order graph (GraphCycles, ~1.5% of the
  // server's CPU under streaming load). The tests keep the detection on; the
  // server runs code they have checked.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // First, so that every thread started later inherits the mask.
  const sigset_t signals = attnserve::BlockSignals();

  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    absl::FPrintF(stderr, "attnserve: unexpected argument '%s'\n",
                  positional[1]);
    return 1;
  }
  absl::StatusOr<attnserve::ServerConfig> config =
      attnserve::ServerConfigFromFlags();
  if (!config.ok()) return Fail(config.status());

  absl::StatusOr<attnserve::Engines> engines =
      attnserve::MakeWarmEngines(config->engine, config->wide_engine);
  if (!engines.ok()) return Fail(engines.status());
  absl::FPrintF(stderr, "attnserve: %s\n", config->threads_note);

  // Before any listener opens.
  absl::StatusOr<attnserve::FdLimit> fd_limit = attnserve::RaiseFdLimit();
  if (!fd_limit.ok()) return Fail(fd_limit.status());
  const int fd_reserve = attnserve::InstallAcceptGuard(config->fd_reserve);
  absl::FPrintF(stderr,
                "attnserve: file descriptors: soft limit %d -> %d (the hard "
                "limit); new connections refused while fewer than %d would "
                "stay free (--fd_reserve)\n",
                fd_limit->soft_before, fd_limit->soft, fd_reserve);

  absl::StatusOr<std::unique_ptr<attnserve::ExecutionStack>> core =
      attnserve::ExecutionStack::Create(config->core,
                                        std::move(engines->engine),
                                        std::move(engines->wide_engine));
  if (!core.ok()) return Fail(core.status());
  // After the core's gauges have their sources: a scrape may come at once.
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> metrics =
      attnserve::ServeMetrics(config->metrics_host, config->metrics_port,
                              &(*core)->metrics());
  if (!metrics.ok()) return Fail(metrics.status());

  // Background compactions are counted; one that gave way to a change of
  // its model (ABORTED) is neither done nor refused.
  config->repository.compaction.on_done =
      [metrics = &(*core)->metrics()](const std::string& model,
                                      const absl::Status& status,
                                      absl::Duration) {
        if (absl::IsAborted(status)) return;
        metrics->ModelEvent("compact", !status.ok());
        if (status.ok()) metrics->Compacted(model);
      };
  absl::StatusOr<std::unique_ptr<attnserve::ModelRepository>> repository =
      attnserve::LoadModelRepository(config->repository);
  if (!repository.ok()) return Fail(repository.status());
  for (const std::string& name : (*repository)->Names()) {
    absl::FPrintF(stderr, "attnserve: model repository: %s\n", name);
  }

  // What every front end shares, one of each: the token store, the
  // catalogue of models, and the core's readiness.
  std::unique_ptr<attnserve::TokenStore> tokens;
  if (!config->auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<attnserve::TokenStore>> loaded =
        attnserve::TokenStore::Load(config->auth_tokens_file);
    if (!loaded.ok()) return Fail(loaded.status());
    tokens = *std::move(loaded);
    absl::FPrintF(stderr,
                  "attnserve: token authentication: %d tokens from %s "
                  "(health checks stay open; SIGHUP or an edit reloads)\n",
                  tokens->size(), config->auth_tokens_file);
  }
  // Every change to the served models, and every refused one, is logged
  // and counted.
  attnserve::ModelControl control;
  control.explicit_mode = config->explicit_model_control;
  control.needs_permission = tokens != nullptr;
  control.on_event = [metrics = &(*core)->metrics()](
                         const attnserve::ModelEvent& event) {
    // Appends and evictions may come many a second: counted, and logged
    // when refused.
    if ((event.event != "append" && event.event != "evict") ||
        !event.status.ok()) {
      absl::FPrintF(stderr, "attnserve: %s\n", event.Describe());
    }
    metrics->ModelEvent(event.event, !event.status.ok());
    if ((event.event == "append" || event.event == "evict") &&
        event.status.ok()) {
      metrics->RowsChanged(event.model, event.event == "evict", event.took);
    }
  };
  attnserve::ModelCatalogue catalogue(repository->get(), control);
  (*core)->metrics().SetStoredRowsSource([&catalogue] {
    std::vector<attnserve::ServiceMetrics::StoredRows> rows;
    for (const auto& count : catalogue.RowCounts()) {
      rows.push_back({count.model, count.rows, count.files, count.evicted_rows,
                      count.pieces});
    }
    return rows;
  });
  attnserve::AttentionService typed(&(*core)->calls(), &catalogue);
  attnserve::InferenceService kserve(core->get(), &catalogue,
                                     config->max_batch_size);
  attnserve::KServeRestService kserve_rest(core->get(), &catalogue,
                                           config->max_batch_size);

  absl::StatusOr<std::unique_ptr<attnserve::GrpcServer>> server =
      attnserve::GrpcServer::Start(
          config->grpc, &(*core)->metrics(), tokens.get(),
          {{"attention.v1.AttentionService", &typed},
           {"inference.GRPCInferenceService", &kserve}});
  if (!server.ok()) return Fail(server.status());
  std::unique_ptr<attnserve::HttpServer> http;
  if (config->http.port != 0) {
    absl::StatusOr<std::unique_ptr<attnserve::HttpServer>> started =
        attnserve::HttpServer::Start(config->http, &(*core)->metrics(),
                                     tokens.get(), &kserve_rest);
    if (!started.ok()) return Fail(started.status());
    http = *std::move(started);
  }
  if (tokens != nullptr) tokens->StartWatching();
  const std::vector<int> metrics_ports = (*metrics)->GetListeningPorts();
  absl::FPrintF(stderr, "attnserve: metrics on http://%s:%d/metrics\n",
                config->metrics_host,
                metrics_ports.empty() ? 0 : metrics_ports.front());
  absl::FPrintF(stderr, "attnserve listening on %s:%d\n", config->grpc.host,
                (*server)->port());

  const int signal_number = attnserve::WaitForTermination(signals, [&tokens] {
    absl::FPrintF(stderr, "attnserve: SIGHUP: %s\n",
                  tokens != nullptr ? tokens->ReloadForLog()
                                    : std::string("nothing to reload"));
  });
  absl::FPrintF(stderr,
                "attnserve: %s received; NOT_SERVING for %d ms, then "
                "draining for up to %d ms\n",
                signal_number == SIGTERM ? "SIGTERM" : "SIGINT",
                absl::ToInt64Milliseconds(config->drain_notice),
                absl::ToInt64Milliseconds(config->grace_period));
  const attnserve::ExecutionStack::DrainReport drain = (*core)->Drain(
      config->drain_notice, config->grace_period,
      [&server] { (*server)->SetNotServing(); });
  if (drain.answered) {
    // Responses handed to the sockets are on their way; give the clients a
    // moment to read them before the sockets close.
    absl::SleepFor(absl::Milliseconds(100));
    absl::FPrintF(stderr,
                  "attnserve: drained: the %d calls in flight were answered "
                  "in %s; stopped\n",
                  drain.accepted, absl::FormatDuration(drain.took));
  } else {
    // Past the grace period: the calls still running get UNAVAILABLE as
    // their connections close (a kernel cannot be interrupted).
    absl::FPrintF(stderr,
                  "attnserve: grace period over with %d calls unanswered "
                  "(kernels still running or responses not read); stopped, "
                  "abandoning them\n",
                  drain.unanswered);
  }
  // Exit without destructors: an abandoned kernel may still be running, and
  // the metrics exposer's web server takes ~2 s to stop; nothing is left to
  // flush but stdio.
  std::fflush(nullptr);
  std::_Exit(0);
}
