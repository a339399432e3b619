#include "client/load_target.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnctl {
namespace {

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EqualsIgnoreCase(host, "localhost") ||
      absl::EqualsIgnoreCase(host, "localhost.")) {
    return true;
  }
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) ||
           (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

// The host of "host", "host:port", "[v6]", "[v6]:port" or a bare IPv6
// address; nullopt when malformed.
std::optional<absl::string_view> HostOf(absl::string_view address) {
  if (address.empty()) return std::nullopt;
  if (address[0] == '[') {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return std::nullopt;
    const absl::string_view rest = address.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return std::nullopt;
    return address.substr(1, close - 1);
  }
  const size_t colons = std::count(address.begin(), address.end(), ':');
  if (colons == 1) return address.substr(0, address.find(':'));
  return address;  // no port, or a bare IPv6 address
}

}  // namespace

bool IsLoopbackTarget(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") ||
      absl::StartsWith(target, "unix-abstract:")) {
    return true;  // a socket on this machine
  }
  bool list = false;
  if (absl::ConsumePrefix(&target, "ipv4:") ||
      absl::ConsumePrefix(&target, "ipv6:")) {
    list = true;
  } else if (!absl::ConsumePrefix(&target, "dns:")) {
    // No scheme gRPC knows: it reads the target as dns:///target.
    const std::optional<absl::string_view> host = HostOf(target);
    return host.has_value() && IsLoopbackHost(*host);
  }
  if (absl::ConsumePrefix(&target, "//")) {
    // An authority (dns: a name server to ask) is not ours to trust.
    if (!absl::ConsumePrefix(&target, "/")) return false;
  }
  if (!list) {
    const std::optional<absl::string_view> host = HostOf(target);
    return host.has_value() && IsLoopbackHost(*host);
  }
  if (target.empty()) return false;
  for (absl::string_view address : absl::StrSplit(target, ',')) {
    const std::optional<absl::string_view> host = HostOf(address);
    if (!host.has_value() || !IsLoopbackHost(*host)) return false;
  }
  return true;
}

}  // namespace attnctl
