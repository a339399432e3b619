// The kernel engines the server runs on, made and warmed up before any port
// opens: the engine every call runs on (--backend, --kernel_threads) and,
// where the kernels run on the CPU, the wide engine a stored version's
// batches run on one at a time (--stored_memory_threads;
// server/execution/batcher.h). Each is warmed (oneDNN's JIT, the GPU's
// module loads) so that the first requests do not pay for it; the main
// engine's notes and backends are logged.
//
// Blocks while it warms up; called once, from main, before serving.
#ifndef ATTNSERVE_SERVER_ENGINES_H_
#define ATTNSERVE_SERVER_ENGINES_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "attn/engine.h"

namespace attnserve {

struct Engines {
  std::unique_ptr<attn::Engine> engine;
  std::unique_ptr<attn::Engine> wide_engine;  // null: none
};

// `wide` is dropped when the main engine runs on a GPU (a memory's batches
// then stay on its engine). The engine's own status (FAILED_PRECONDITION
// for a GPU asked for and missing) or a warm-up failure, said as such.
absl::StatusOr<Engines> MakeWarmEngines(
    const attn::EngineOptions& main,
    const std::optional<attn::EngineOptions>& wide);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_ENGINES_H_
