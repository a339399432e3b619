#include "server/signals.h"

#include <pthread.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

namespace attnserve {

sigset_t BlockSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  if (int err = pthread_sigmask(SIG_BLOCK, &signals, nullptr); err != 0) {
    absl::FPrintF(stderr, "attnserve: pthread_sigmask: %s\n",
                  std::strerror(err));
    std::exit(1);
  }
  return signals;
}

int WaitForTermination(const sigset_t& signals,
                       const std::function<void()>& on_sighup) {
  while (true) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number != SIGHUP) return signal_number;
    on_sighup();
  }
}

}  // namespace attnserve
