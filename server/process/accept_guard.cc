#include "server/process/accept_guard.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

using Accept4 = int (*)(int, sockaddr*, socklen_t*, int);

// -1: not installed, pass through.
std::atomic<int> refuse_from_fd{-1};
std::atomic<int> spare_fd{-1};
std::atomic<int64_t> refused{0};

Accept4 RealAccept4() {
  static const Accept4 real =
      reinterpret_cast<Accept4>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

int GuardedAccept4(int listener, sockaddr* addr, socklen_t* len, int flags) {
  const Accept4 real = RealAccept4();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  for (;;) {
    const int limit = refuse_from_fd.load(std::memory_order_relaxed);
    const int fd = real(listener, addr, len, flags);
    if (limit < 0) return fd;
    if (fd >= 0) {
      if (fd < limit) return fd;
      close(fd);  // within the reserve: refuse it, then the next pending one
      refused.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EMFILE && errno != ENFILE) return -1;  // EAGAIN among them
    const int spare = spare_fd.exchange(-1);
    if (spare >= 0) close(spare);
    const int pending = real(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (pending >= 0) {
      close(pending);
      refused.fetch_add(1, std::memory_order_relaxed);
    }
    const int reopened = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (reopened >= 0 && spare_fd.exchange(reopened) >= 0) close(reopened);
    if (pending >= 0) continue;
    errno = EAGAIN;  // nothing could be taken now: wait for the next one
    return -1;
  }
}

}  // namespace

absl::StatusOr<FdLimit> RaiseFdLimit() {
  rlimit limits{};
  if (getrlimit(RLIMIT_NOFILE, &limits) != 0) {
    return absl::InternalError(
        absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  constexpr rlim_t kCeiling = rlim_t{1} << 20;
  FdLimit result;
  result.soft_before = static_cast<int64_t>(std::min(limits.rlim_cur, kCeiling));
  result.hard = static_cast<int64_t>(std::min(limits.rlim_max, kCeiling));
  const rlim_t target = std::min(limits.rlim_max, kCeiling);
  if (limits.rlim_cur < target) {
    limits.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &limits) != 0) {
      return absl::InternalError(
          absl::StrCat("setrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
    }
  }
  result.soft = std::max(result.soft_before, static_cast<int64_t>(target));
  return result;
}

int InstallAcceptGuard(int reserve_fds) {
  rlimit limits{};
  int64_t soft = 1024;
  if (getrlimit(RLIMIT_NOFILE, &limits) == 0) {
    soft = static_cast<int64_t>(std::min<rlim_t>(limits.rlim_cur, rlim_t{1} << 20));
  }
  const int reserve = static_cast<int>(
      std::clamp<int64_t>(reserve_fds, 0, soft / 2));
  // Opened anew: the spare must lie below the limit to free a slot there.
  const int old_spare =
      spare_fd.exchange(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (old_spare >= 0) close(old_spare);
  refuse_from_fd.store(static_cast<int>(soft - reserve));
  return reserve;
}

int64_t ConnectionsRefusedByAcceptGuard() { return refused.load(); }
void CountConnectionRefused() {
  refused.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace attnserve

// The process's accept4: gRPC's listeners (and anything else in the
// process) call this one, which the executable defines and the dynamic
// linker binds before the C library's.
extern "C" int accept4(int listener, struct sockaddr* addr, socklen_t* len,
                       int flags) {
  return attnserve::GuardedAccept4(listener, addr, len, flags);
}
