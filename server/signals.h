// The process's signals: SIGTERM and SIGINT start the drain, SIGHUP asks
// for a reload. They are blocked in every thread (BlockSignals, first thing
// in main, so threads started later inherit the mask) and taken by one
// thread with sigwait, so no handler runs at an arbitrary point.
#ifndef ATTNSERVE_SERVER_SIGNALS_H_
#define ATTNSERVE_SERVER_SIGNALS_H_

#include <signal.h>

#include <functional>

namespace attnserve {

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread; exits the
// process (status 1) if it cannot.
sigset_t BlockSignals();

// Blocks until SIGTERM or SIGINT arrives and returns its number; calls
// `on_sighup` for each SIGHUP meanwhile.
int WaitForTermination(const sigset_t& signals,
                       const std::function<void()>& on_sighup);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_SIGNALS_H_
