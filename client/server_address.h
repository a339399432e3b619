// The address of a running attnserve, read off its command line: what
// `attnctl health --target_from_cmdline=/proc/1/cmdline` checks, so that a
// container's HEALTHCHECK follows the --grpc_port and --host the container
// was started with instead of assuming localhost:8001.
//
// Thread-compatible: pure functions. Errors are INVALID_ARGUMENT (not
// retryable: the command line will not change) and say what is wrong.
#ifndef ATTNSERVE_CLIENT_SERVER_ADDRESS_H_
#define ATTNSERVE_CLIENT_SERVER_ADDRESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnctl {

// The arguments in the contents of a /proc/PID/cmdline file: each one ends
// in a NUL (a missing final NUL is tolerated). Empty contents (a zombie or a
// kernel thread) give no arguments.
std::vector<std::string> SplitProcCmdline(absl::string_view contents);

// The gRPC target ("host:port") of the attnserve started with `args`
// (argv, argv[0] first), as attnserve's own flag parsing would read them:
// --grpc_port (default 8001) and --host (default 0.0.0.0), given as
// --flag=value, --flag value, -flag=value or -flag value; the last one wins.
//
// Every argument after argv[0] is read, "--" included, so a wrapper in front
// of attnserve (`tini -- attnserve --grpc_port=9001`, docker run --init) does
// not hide its flags. A wildcard --host is reached through loopback: 0.0.0.0
// as 127.0.0.1, [::] or :: as [::1], an empty one as localhost; any other
// host is used as given (an IPv6 literal gets its brackets).
//
// INVALID_ARGUMENT when `args` is empty, when --grpc_port is not a port in
// [1, 65535] (0, "any free port", cannot be known from outside) or has no
// value, or when a --flagfile, --fromenv or --tryfromenv could set the flags
// out of sight.
absl::StatusOr<std::string> ServerTargetFromArgs(
    const std::vector<std::string>& args);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_SERVER_ADDRESS_H_
