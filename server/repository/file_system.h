// The file-system calls the model repository makes, behind a small
// interface (LevelDB's Env, narrowed to files and folders) so that tests can
// fail any one of them (ENOSPC on a write, EIO on a close or an fsync, EROFS
// on a mkdir) or stop at any step as a crash would, without root.
//
// Every call is one step and does exactly one system call's work (Append
// loops over short writes). A failed step's status carries the errno's
// meaning in its code, the same for every implementation:
//   ENOSPC, EDQUOT, EFBIG          RESOURCE_EXHAUSTED (the disk is full)
//   EROFS, EACCES, EPERM           FAILED_PRECONDITION (not writable)
//   ENOENT                         NOT_FOUND
//   EEXIST, ENOTEMPTY              ALREADY_EXISTS
//   anything else (EIO, ...)       INTERNAL
// and its message is "<call>: <strerror>" without the path: callers add what
// they were doing in words that never show the server's folders.
//
// Thread-safe: an implementation may be called from several threads.
#ifndef ATTNSERVE_SERVER_REPOSITORY_FILE_SYSTEM_H_
#define ATTNSERVE_SERVER_REPOSITORY_FILE_SYSTEM_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnserve {

// The status for `call` having failed with `error` (an errno value), coded
// as the table above says.
absl::Status FileSystemError(absl::string_view call, int error);

// A file being written. Not thread-safe. Destroying it closes it if Close
// was not called (ignoring errors).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `data` at the end of the file, or fails.
  virtual absl::Status Append(absl::string_view data) = 0;
  // fsync(2): the data written so far survives a crash once this is OK.
  virtual absl::Status Sync() = 0;
  // close(2); call it once. A failed close may have lost written data.
  virtual absl::Status Close() = 0;
};

// A file's bytes, read-only, for as long as the object lives
// (FileSystem::MapFile): the file's own pages, mapped under a lease
// (server/repository/mapped_file.h), or a private copy. Immutable: any
// number of threads may read it; share it by shared_ptr.
class FileBytes {
 public:
  virtual ~FileBytes() = default;
  absl::string_view bytes() const { return bytes_; }
  // Empty when the bytes are the file's mapped pages; else why they are a
  // private copy, in words for the operator's log.
  const std::string& why_copied() const { return why_copied_; }

 protected:
  FileBytes(absl::string_view bytes, std::string why_copied)
      : bytes_(bytes), why_copied_(std::move(why_copied)) {}

 private:
  const absl::string_view bytes_;
  const std::string why_copied_;
};

// A file of scratch bytes without a name (FileSystem::NewScratchFile): rows
// the server keeps on disk instead of in its own memory, which no crash can
// leave behind and nothing reads but this process. Written at any offset,
// read through mappings, each of which keeps the file's bytes alive after
// the object is gone. Not thread-safe for writes; a mapping may be read
// from any thread.
class ScratchFile {
 public:
  virtual ~ScratchFile() = default;
  // pwrite(2) of all of `data` at `offset`, the file growing as needed, or
  // fails (RESOURCE_EXHAUSTED when the disk is full).
  virtual absl::Status WriteAt(int64_t offset, absl::string_view data) = 0;
  // A read-only shared mapping of bytes [0, length); `length` may pass the
  // file's end, and the mapping then shows what is written there later.
  // Only bytes written may be read: past the file's end a read faults.
  virtual absl::StatusOr<std::shared_ptr<const uint8_t>> Map(
      int64_t length) = 0;
};

// `bytes` held as FileBytes (a file that arrived in a request), with
// why_copied `why`.
std::shared_ptr<const FileBytes> FileBytesInMemory(std::string bytes,
                                                   std::string why);

class FileSystem {
 public:
  struct Entry {
    std::string name;         // without the folder
    bool is_dir = false;      // a folder, or a link to one
    bool is_symlink = false;  // the entry itself is a symbolic link
    absl::Time modified;      // the entry's own mtime (lstat)
  };

  virtual ~FileSystem() = default;

  // Reading. Not steps: they change nothing.
  // The whole file; RESOURCE_EXHAUSTED, reading no more, when it holds more
  // than `max_bytes` (at open, or grown past it while read).
  virtual absl::StatusOr<std::string> ReadFile(
      const std::string& path,
      int64_t max_bytes = std::numeric_limits<int64_t>::max()) = 0;
  // The whole file, as ReadFile reads it (the same errors), held without a
  // copy where the file can be mapped under a lease: the POSIX file
  // system's does so for a non-empty file that can; this default reads a
  // copy, saying so in why_copied.
  virtual absl::StatusOr<std::shared_ptr<const FileBytes>> MapFile(
      const std::string& path,
      int64_t max_bytes = std::numeric_limits<int64_t>::max());
  // The folder's entries without "." and "..", unsorted.
  virtual absl::StatusOr<std::vector<Entry>> ListDir(
      const std::string& path) = 0;
  // The entry at `path` (its name is left empty); NOT_FOUND without one.
  virtual absl::StatusOr<Entry> Stat(const std::string& path) = 0;

  // Writing: each call one step.
  // Creates `path` (mode 0644); ALREADY_EXISTS if it is there.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // mkdir(2), mode 0755.
  virtual absl::Status CreateDir(const std::string& path) = 0;
  // fsync(2) of a folder: its entries (creations, renames, removals) survive
  // a crash once this is OK.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // rename(2): atomic; replaces `to` if it is a file or an empty folder.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // renameat2(RENAME_EXCHANGE): swaps the two entries at once (Linux >= 3.15
  // and a file system that has it: ext4, xfs, btrfs, tmpfs do; NFS does
  // not). UNIMPLEMENTED where the kernel or file system lacks it.
  virtual absl::Status Exchange(const std::string& a, const std::string& b) = 0;
  // unlink(2) of a file or a symbolic link.
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // rmdir(2) of an empty folder.
  virtual absl::Status RemoveDir(const std::string& path) = 0;
  // A scratch file on the file system of folder `dir`: open(2) with
  // O_TMPFILE, or where the file system lacks it a hidden name
  // (.rows-scratch.tmp-<pid>-<n>, which a start removes as other leftovers)
  // unlinked at once. This default: UNIMPLEMENTED (the rows stay in memory).
  virtual absl::StatusOr<std::unique_ptr<ScratchFile>> NewScratchFile(
      const std::string& dir);
};

// The process's POSIX file system. Never freed.
FileSystem* DefaultFileSystem();

// Removes `path` and, if it is a folder (not a link to one), everything in
// it, through `fs`; a link is removed, never followed. The first failure.
absl::Status RemoveTree(FileSystem& fs, const std::string& path);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_FILE_SYSTEM_H_
