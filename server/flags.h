// attnserve's configuration as its flags give it: ServerConfigFromFlags
// reads every flag once (after absl::ParseCommandLine), checks them and
// turns them into the Options of each part. The flags themselves, with
// their defaults and help, are in flags.cc (`attnserve --helpfull` lists
// them).
#ifndef ATTNSERVE_SERVER_FLAGS_H_
#define ATTNSERVE_SERVER_FLAGS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attn/engine.h"
#include "server/transport/grpc_server.h"
#include "server/transport/http_server.h"
#include "server/process/cpu_budget.h"
#include "server/execution/execution_stack.h"
#include "server/repository/model_repository.h"

namespace attnserve {

struct ServerConfig {
  attn::EngineOptions engine;
  // The engine stored-memory batches run on, one at a time, when their
  // calls may use more threads than the others' (--stored_memory_threads):
  // always the CPU's (main drops it when the engine runs on a GPU).
  std::optional<attn::EngineOptions> wide_engine;
  ExecutionStack::Options core;
  GrpcServerOptions grpc;
  HttpServerOptions http;  // port 0: no HTTP front end
  ModelRepository::Options repository;
  // Every front end's: bearer tokens (empty: none), live model control,
  // and the max_batch_size KServe's ModelConfig reports.
  std::string auth_tokens_file;
  bool explicit_model_control = false;
  int max_batch_size = 32;
  std::string metrics_host;
  int metrics_port = 8002;
  int fd_reserve = 256;  // server/process/accept_guard.h
  // SIGTERM: NOT_SERVING but serving for the notice, then the drain of the
  // accepted calls for at most the grace period.
  absl::Duration drain_notice;
  absl::Duration grace_period;
  // The start-up log's line on CPUs and threads.
  std::string threads_note;
};

// INVALID_ARGUMENT naming the flag (and what it must be) for any flag out
// of range or malformed. Reads the process's CPU budget (cgroups).
absl::StatusOr<ServerConfig> ServerConfigFromFlags();

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_FLAGS_H_
