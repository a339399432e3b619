#include "server/repository/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace attnserve {
namespace {

int LeaseSignal() { return SIGRTMIN + kLeaseSignalOffset; }

// The signals a lease break may come as: the one set with F_SETSIG, or
// SIGIO when the kernel's signal queue is full.
sigset_t LeaseSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, LeaseSignal());
  sigaddset(&signals, SIGIO);
  return signals;
}

// The keeper blocks the lease signals and waits for them (sigtimedwait); a
// break that reaches another thread (sent to the process, in the instant
// between taking a lease and naming the keeper's thread its owner) meets
// this handler instead of the default action, which would end the process,
// and the keeper finds the break on its next look, within a second.
extern "C" void IgnoreLeaseSignal(int) {}

void Log(const std::string& note) {
  std::fprintf(stderr, "attnserve: model repository: %s\n", note.c_str());
}

class GuardedMapping;

// The thread that answers lease breaks (see the header).
class LeaseKeeper {
 public:
  // The process's keeper, started on the first call; an error when its
  // signal is taken by another handler or the thread cannot start.
  static absl::StatusOr<LeaseKeeper*> Get();

  pid_t tid() const { return tid_; }
  void Add(GuardedMapping* mapping) ABSL_LOCKS_EXCLUDED(mu_);
  // After Remove, the keeper no longer touches `mapping`.
  void Remove(GuardedMapping* mapping) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LeaseKeeper() = default;
  static absl::StatusOr<LeaseKeeper*> Start();
  // Has the keeper look at every lease now.
  void Wake() const;
  void Run();

  pid_t tid_ = 0;
  absl::Mutex mu_;
  std::set<GuardedMapping*> mappings_ ABSL_GUARDED_BY(mu_);
};

// A file mapped read-only under a read lease, until the lease breaks; then
// a private copy at the same addresses.
class GuardedMapping : public FileBytes {
 public:
  GuardedMapping(LeaseKeeper* keeper, int fd, void* address, size_t size,
                 std::string path)
      : FileBytes(absl::string_view(static_cast<const char*>(address), size),
                  ""),
        keeper_(keeper),
        fd_(fd),
        address_(address),
        size_(size),
        path_(std::move(path)) {}

  ~GuardedMapping() override {
    keeper_->Remove(this);
    if (fd_ >= 0) ReleaseLease();
    ::munmap(address_, size_);
  }

  // Called by the keeper, under its lock, each time it looks (on a lease
  // signal, and once a second): once the lease is being broken (F_GETLEASE
  // then answers the lease it is being broken to, F_UNLCK), copies the
  // file's bytes in place of the mapping and releases the lease.
  void CopyIfLeaseBroken() {
    if (fd_ < 0 || ::fcntl(fd_, F_GETLEASE) == F_RDLCK) return;
    void* copy = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) {
      Log(absl::StrCat(path_, " is being changed on disk, and a private copy "
                       "of its ", size_, " bytes could not be made (mmap: ",
                       std::strerror(errno), "): the served model reads the "
                       "file as it changes"));
    } else {
      std::memcpy(copy, address_, size_);
      ::mprotect(copy, size_, PROT_READ);
      if (::mremap(copy, size_, size_, MREMAP_MAYMOVE | MREMAP_FIXED,
                   address_) == MAP_FAILED) {
        Log(absl::StrCat(path_, ": mremap: ", std::strerror(errno),
                         ": the served model reads the file as it changes"));
        ::munmap(copy, size_);
      } else {
        Log(absl::StrCat(path_, " is being changed on disk: the models "
                         "served from it keep a private copy of its ", size_,
                         " bytes until they are unloaded or reloaded"));
      }
    }
    ReleaseLease();
  }

 private:
  void ReleaseLease() {
    ::fcntl(fd_, F_SETLEASE, F_UNLCK);
    ::close(fd_);
    fd_ = -1;
  }

  LeaseKeeper* const keeper_;
  // -1 once the lease is released. Used by the keeper under its lock, and
  // by the destructor only after Remove, so never by two threads at once.
  int fd_;
  void* const address_;
  const size_t size_;
  const std::string path_;
};

absl::StatusOr<LeaseKeeper*> LeaseKeeper::Get() {
  static const absl::StatusOr<LeaseKeeper*> keeper = Start();
  return keeper;
}

absl::StatusOr<LeaseKeeper*> LeaseKeeper::Start() {
  struct sigaction action = {};
  action.sa_handler = IgnoreLeaseSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  struct sigaction previous = {};
  if (::sigaction(LeaseSignal(), nullptr, &previous) != 0 ||
      (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "signal SIGRTMIN+", kLeaseSignalOffset, " has another handler"));
  }
  ::sigaction(LeaseSignal(), &action, nullptr);
  if (::sigaction(SIGIO, nullptr, &previous) == 0 &&
      previous.sa_handler == SIG_DFL) {
    ::sigaction(SIGIO, &action, nullptr);
  }
  auto* keeper = new LeaseKeeper();  // never freed, as its thread runs on
  absl::Notification started;
  std::thread([keeper, &started] {
    // Blocked here before any lease names this thread, so that a break
    // waits for sigtimedwait instead of running the handler.
    const sigset_t signals = LeaseSignals();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    keeper->tid_ = static_cast<pid_t>(::syscall(SYS_gettid));
    started.Notify();
    keeper->Run();
  }).detach();
  started.WaitForNotification();
  return keeper;
}

void LeaseKeeper::Wake() const {
  ::syscall(SYS_tgkill, ::getpid(), tid_, LeaseSignal());
}

void LeaseKeeper::Run() {
  const sigset_t signals = LeaseSignals();
  for (;;) {
    // A lease break's signal, a wake-up, or a second gone: look at every
    // lease. Looking costs one fcntl a mapping; the second bounds the wait
    // of a break whose signal went to another thread.
    const struct timespec period = {1, 0};
    ::sigtimedwait(&signals, nullptr, &period);
    absl::MutexLock lock(&mu_);
    for (GuardedMapping* mapping : mappings_) mapping->CopyIfLeaseBroken();
  }
}

void LeaseKeeper::Add(GuardedMapping* mapping) {
  {
    absl::MutexLock lock(&mu_);
    mappings_.insert(mapping);
  }
  // A break that came before the mapping was added woke the keeper when
  // it had nothing to copy: look again.
  Wake();
}

void LeaseKeeper::Remove(GuardedMapping* mapping) {
  absl::MutexLock lock(&mu_);
  mappings_.erase(mapping);
}

std::string WhyNoLease(int error) {
  switch (error) {
    case EAGAIN:
      return "another process holds the file open for writing";
    case EACCES:
    case EPERM:
      return "the server neither owns the file nor has CAP_LEASE";
    case EINVAL:
    case ENOSYS:
      return "the file system does not grant leases, or leases are disabled "
             "(/proc/sys/fs/leases-enable)";
    default:
      return std::strerror(error);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const FileBytes>> MapUnderLease(
    int fd, int64_t size, const std::string& path) {
  absl::StatusOr<LeaseKeeper*> keeper = LeaseKeeper::Get();
  if (!keeper.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not mapped: no lease keeper (", keeper.status().message(), ")"));
  }
  auto refuse = [&](absl::string_view why) {
    ::fcntl(fd, F_SETLEASE, F_UNLCK);
    return absl::FailedPreconditionError(absl::StrCat("not mapped: ", why));
  };
  // The signal first: taking the lease makes the process (any thread) the
  // one told, with whatever signal is set; the handler is installed for
  // every thread, and the keeper's thread is then named.
  if (::fcntl(fd, F_SETSIG, LeaseSignal()) != 0) {
    return refuse(absl::StrCat("F_SETSIG: ", std::strerror(errno)));
  }
  if (::fcntl(fd, F_SETLEASE, F_RDLCK) != 0) {
    const int error = errno;
    return absl::FailedPreconditionError(
        absl::StrCat("not mapped: no read lease (", WhyNoLease(error), ")"));
  }
  struct f_owner_ex owner = {F_OWNER_TID, (*keeper)->tid()};
  ::fcntl(fd, F_SETOWN_EX, &owner);
  // Changed between the caller's look and the lease: the caller reads it.
  struct stat info;
  if (::fstat(fd, &info) != 0 || info.st_size != size) {
    return refuse("the file changed size as it was opened");
  }
  void* address = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ,
                         MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    return refuse(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  auto mapping = std::make_shared<GuardedMapping>(
      *keeper, fd, address, static_cast<size_t>(size), path);
  (*keeper)->Add(mapping.get());
  return std::shared_ptr<const FileBytes>(std::move(mapping));
}

}  // namespace attnserve
