// FUZZ_CHECK: the fuzz targets' assertion, on in every build.
#ifndef ATTN_FUZZ_COMMON_CHECK_H_
#define ATTN_FUZZ_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

// Aborts with the condition and a message when `condition` is false: a crash
// (deadly signal) to libFuzzer, with the reason in the log.
#define FUZZ_CHECK(condition, ...)                                        \
  do {                                                                    \
    if (!(condition)) {                                                   \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: ", __FILE__,  \
                   __LINE__, #condition);                                 \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fprintf(stderr, "\n");                                         \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

#endif  // ATTN_FUZZ_COMMON_CHECK_H_
