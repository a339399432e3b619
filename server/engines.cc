#include "server/engines.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnserve {
namespace {

// The engine of `options`, warmed up; `describe`: log its notes and
// backends.
absl::StatusOr<std::unique_ptr<attn::Engine>> WarmEngine(
    const attn::EngineOptions& options, bool describe) {
  absl::StatusOr<std::unique_ptr<attn::Engine>> engine =
      attn::Engine::Create(options);
  if (!engine.ok()) {
    return absl::Status(engine.status().code(),
                        absl::StrCat("creating the engine: ",
                                     engine.status().ToString()));
  }
  if (absl::Status warm = (*engine)->WarmUp(); !warm.ok()) {
    return absl::Status(warm.code(), absl::StrCat("warming up the kernels: ",
                                                  warm.ToString()));
  }
  if (!describe) return engine;
  for (const std::string& note : (*engine)->notes()) {
    absl::FPrintF(stderr, "attnserve: %s\n", note);
  }
  const std::vector<std::string> descriptions =
      (*engine)->backend_descriptions();
  for (size_t i = 0; i < descriptions.size(); ++i) {
    absl::FPrintF(stderr, "attnserve: backend %d of %d: %s\n", i + 1,
                  descriptions.size(), descriptions[i]);
  }
  return engine;
}

}  // namespace

absl::StatusOr<Engines> MakeWarmEngines(
    const attn::EngineOptions& main,
    const std::optional<attn::EngineOptions>& wide) {
  Engines engines;
  absl::StatusOr<std::unique_ptr<attn::Engine>> engine =
      WarmEngine(main, /*describe=*/true);
  if (!engine.ok()) return engine.status();
  engines.engine = *std::move(engine);
  // Where the kernels run on a GPU, a memory's batches stay on its engine.
  if (wide.has_value() && engines.engine->device() != attn::Device::kCuda) {
    absl::StatusOr<std::unique_ptr<attn::Engine>> wide_engine =
        WarmEngine(*wide, /*describe=*/false);
    if (!wide_engine.ok()) return wide_engine.status();
    engines.wide_engine = *std::move(wide_engine);
  }
  return engines;
}

}  // namespace attnserve
