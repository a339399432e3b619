// A model file's bytes mapped into memory and guarded against the file
// being changed in place.
//
// Mapped, a file costs no copy at load and no memory of the process's own:
// its pages are the page cache's, shared with every other process that maps
// or reads the file, so two replicas on one machine hold one copy. But a
// plain mapping shows the file as it is now: truncated under it, a read past
// the new end raises SIGBUS; rewritten in place, values change under every
// reader. MapUnderLease therefore takes a read lease on the file (fcntl
// F_SETLEASE) before mapping it. The kernel then holds back any open of the
// file for writing and any truncate(2) of it, and tells this process first.
// One thread of this module, the lease keeper, answers by copying the mapped
// bytes into private memory at the same addresses (an mremap over the
// mapping, done under the kernel's mmap lock, so that a reader finds the
// file's page or the copy's, never a hole) and only then releases the lease
// and lets the writer go on. Readers see the same values throughout; the
// copy costs what reading the file would have, and only once the file is
// being changed. Renaming or removing the file changes nothing here (the
// mapping holds the file itself, not its name), which is how the model
// repository's own saves replace a model.
//
// A lease needs a file system that grants them (local ones such as ext4,
// xfs, tmpfs and overlayfs; not NFS), leases enabled
// (/proc/sys/fs/leases-enable), a process that owns the file or has
// CAP_LEASE, and no writer holding the file open. Where one cannot be
// taken, MapUnderLease says why and the caller reads the file instead. The
// keeper must answer within /proc/sys/fs/lease-break-time (45 s by
// default), after which the kernel lets the writer through; it answers in
// the time a memcpy of the file takes. Should the private copy not fit in
// memory, that is logged and the mapping is left to the file.
//
// The keeper is a thread that waits for one real-time signal (SIGRTMIN +
// kLeaseSignalOffset; and SIGIO, which the kernel sends instead should the
// signal queue overflow) with sigtimedwait, looking at every lease on each
// signal and at least once a second, and a handler that ignores those
// signals in every other thread (unless SIGIO has another handler); both
// are set up on the first call and kept for the process's life.
// Thread-safe.
#ifndef ATTNSERVE_SERVER_REPOSITORY_MAPPED_FILE_H_
#define ATTNSERVE_SERVER_REPOSITORY_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/repository/file_system.h"

namespace attnserve {

// The real-time signal a lease break is reported by: SIGRTMIN + this.
inline constexpr int kLeaseSignalOffset = 4;

// Maps the file open as `fd` (opened O_RDONLY, of `size` > 0 bytes when
// the caller looked) under a read lease. On success the result owns `fd`,
// and its FileBytes::why_copied is empty. On failure the caller still owns
// `fd` and the status (FAILED_PRECONDITION) says why the file could not be
// mapped under a lease, in words for the operator's log: the file system
// or the permissions refused the lease, another process holds the file
// open for writing, the file changed size, or the mapping failed. `path` is
// only named in the keeper's log. Blocks only for its system calls (the
// first call also starts the keeper).
absl::StatusOr<std::shared_ptr<const FileBytes>> MapUnderLease(
    int fd, int64_t size, const std::string& path);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_MAPPED_FILE_H_
