// Keeps a flood of connections from exhausting the process's file
// descriptors, and the listening ports alive if they ever are exhausted.
//
// Why: gRPC 1.51 (Debian 12's and 13's) stops listening for good the first
// time accept4 fails with EMFILE ("Failed accept4: Too many open files";
// newer gRPC retries on a timer): one flood past the fd limit closed the
// port until a restart, while old connections kept working. gRPC 1.51 has
// no cap on incoming connections that applies to this listener (see
// docs/security.md, "Connections"), so the guard sits under it: this file
// defines the process's accept4, which gRPC's listener calls, and forwards
// to the C library's.
//
// Once installed:
// - A connection accepted while fewer than `reserve_fds` descriptors would
//   be left free is closed at once (the client sees the connection close;
//   gRPC clients retry with backoff) and counted. accept(2) returns the
//   lowest free descriptor, so the one it returns says exactly how full the
//   table is, at no cost. The reserve keeps descriptors for everything else
//   the server opens (the metrics port, model files, /proc reads).
// - EMFILE or ENFILE from the C library (the table filled by something
//   else) never reaches the caller: a spare descriptor is closed, the
//   pending connection accepted and closed, the spare reopened, and the
//   caller told EAGAIN, so its listener stays armed and serves again as
//   soon as descriptors are free.
// - Pending connections refused are drained in one call, so a refused flood
//   does not sit in the backlog.
// Before InstallAcceptGuard, accept4 passes straight through.
//
// Thread-safe: the state is atomic; accept4 may run on any thread.
#ifndef ATTNSERVE_SERVER_PROCESS_ACCEPT_GUARD_H_
#define ATTNSERVE_SERVER_PROCESS_ACCEPT_GUARD_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace attnserve {

struct FdLimit {
  int64_t soft_before = 0;  // RLIMIT_NOFILE's soft limit as inherited
  int64_t soft = 0;         // ... now
  int64_t hard = 0;
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit (capped at 2^20, as
// fds are an int and the kernel's nr_open defaults to that). INTERNAL if
// getrlimit or setrlimit fail.
absl::StatusOr<FdLimit> RaiseFdLimit();

// Installs the guard with the current soft limit: connections are refused
// while fewer than `reserve_fds` descriptors would stay free (at most half
// the limit is reserved). Returns the reserve in effect. Call once at
// start-up, after RaiseFdLimit and before the servers start; a second call
// replaces the first's settings.
int InstallAcceptGuard(int reserve_fds);

// Connections the guard closed at once, since start, and those a server
// closed at once over its own connection cap (CountConnectionRefused; the
// HTTP server's --http_max_connections): one count,
// attnserve_connections_refused_total.
int64_t ConnectionsRefusedByAcceptGuard();
void CountConnectionRefused();

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_PROCESS_ACCEPT_GUARD_H_
