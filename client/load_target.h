// Which targets `attnctl load` drives without --allow_remote: those that can
// only reach this machine, so that a load test never reaches a production
// server by a mistyped target.
//
// Thread-safe: a pure function over its argument; does not block (it parses,
// and never resolves a name).
#ifndef ATTNSERVE_CLIENT_LOAD_TARGET_H_
#define ATTNSERVE_CLIENT_LOAD_TARGET_H_

#include "absl/strings/string_view.h"

namespace attnctl {

// True when `target` can only reach this machine: localhost, 127.0.0.0/8,
// ::1 (or ::ffff:127.x.y.z), with or without a port, brackets or a dns:,
// ipv4: or ipv6: scheme (every address of an ipv4:/ipv6: list), and unix:
// sockets. Other names are not resolved, so they are not loopback.
bool IsLoopbackTarget(absl::string_view target);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_TARGET_H_
