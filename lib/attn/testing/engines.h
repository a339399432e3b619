// The engines the kernel tests compare: the optimized one as a server runs
// it, the same forced onto every OpenMP thread (so that small test shapes
// exercise the parallel paths too), and the reference alone.
#ifndef ATTN_TESTING_ENGINES_H_
#define ATTN_TESTING_ENGINES_H_

#include <ostream>

#include "attn/engine.h"

namespace attn::testing {

enum class Threads { kDefault, kAlwaysParallel };

void PrintTo(Threads threads, std::ostream* os);

// Process-wide engines, created on first use; abort if creation fails.
Engine& OptimizedEngine(Threads threads);
Engine& ReferenceEngine();

}  // namespace attn::testing

#endif  // ATTN_TESTING_ENGINES_H_
