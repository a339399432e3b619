#include "attn/testing/engines.h"

#include <cstdlib>
#include <iostream>
#include <utility>

namespace attn::testing {
namespace {

Engine* CreateOrDie(const EngineOptions& options) {
  auto engine = Engine::Create(options);
  if (!engine.ok()) {
    std::cerr << "cannot create a test engine: " << engine.status() << "\n";
    std::abort();
  }
  return std::move(engine).value().release();
}

}  // namespace

void PrintTo(Threads threads, std::ostream* os) {
  *os << (threads == Threads::kDefault ? "Default" : "AlwaysParallel");
}

Engine& OptimizedEngine(Threads threads) {
  static Engine* const by_default = CreateOrDie(EngineOptions{});
  static Engine* const always_parallel = [] {
    EngineOptions options;
    options.max_threads = 2;
    options.single_thread_below_flops = 0.0;
    return CreateOrDie(options);
  }();
  return threads == Threads::kDefault ? *by_default : *always_parallel;
}

Engine& ReferenceEngine() {
  static Engine* const engine = [] {
    EngineOptions options;
    options.use_onednn = false;
    return CreateOrDie(options);
  }();
  return *engine;
}

}  // namespace attn::testing
