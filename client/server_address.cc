#include "client/server_address.h"

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnctl {
namespace {

// attnserve's defaults (server/main.cc).
constexpr int32_t kDefaultGrpcPort = 8001;
constexpr absl::string_view kDefaultHost = "0.0.0.0";

// The name of the flag in `arg` ("grpc_port" for --grpc_port=1 or
// -grpc_port), or empty when `arg` is not a flag.
absl::string_view FlagName(absl::string_view arg) {
  if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) return "";
  absl::ConsumePrefix(&arg, "-");
  return arg.substr(0, arg.find('='));
}

// Where a client on the same machine reaches a server bound to `host`.
std::string LoopbackHost(absl::string_view host) {
  if (host == "0.0.0.0") return "127.0.0.1";
  if (host == "::" || host == "[::]") return "[::1]";
  if (host.empty()) return "localhost";
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]");
  }
  return std::string(host);
}

}  // namespace

std::vector<std::string> SplitProcCmdline(absl::string_view contents) {
  absl::ConsumeSuffix(&contents, absl::string_view("\0", 1));
  if (contents.empty()) return {};
  return absl::StrSplit(contents, absl::string_view("\0", 1));
}

absl::StatusOr<std::string> ServerTargetFromArgs(
    const std::vector<std::string>& args) {
  if (args.empty()) {
    return absl::InvalidArgumentError(
        "empty command line (no process, or a kernel thread)");
  }
  std::optional<std::string> port_text;
  std::string host(kDefaultHost);
  for (size_t i = 1; i < args.size(); ++i) {
    const absl::string_view arg = args[i];
    const absl::string_view name = FlagName(arg);
    if (name == "flagfile" || name == "fromenv" || name == "tryfromenv") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the server's command line has %s, which may set --grpc_port out "
          "of sight; give --grpc_port on the command line, or use --target",
          arg));
    }
    if (name != "grpc_port" && name != "host") continue;
    std::string value;
    if (const size_t equals = arg.find('='); equals != arg.npos) {
      value = std::string(arg.substr(equals + 1));
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("the server's command line ends in %s, with no "
                          "value",
                          arg));
    }
    if (name == "grpc_port") {
      port_text = std::move(value);
    } else {
      host = std::move(value);
    }
  }
  int32_t port = kDefaultGrpcPort;
  if (port_text.has_value() &&
      (!absl::SimpleAtoi(*port_text, &port) || port < 1 || port > 65535)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the server's --grpc_port=%s is not a fixed port in [1, 65535]",
        *port_text));
  }
  return absl::StrCat(LoopbackHost(host), ":", port);
}

}  // namespace attnctl
