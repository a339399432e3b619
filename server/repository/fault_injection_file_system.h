// A FileSystem for tests (LevelDB's FaultInjectionTestEnv, narrowed): it
// passes every call to a real one and can
// - fail any step with an errno of the test's choosing (ENOSPC on the n-th
//   write, EIO on a close or an fsync, EROFS on a mkdir), doing nothing;
// - crash: run the first n steps, then none (ABORTED), as if the process
//   were killed between two steps;
// - lose what a power cut loses: file data not fsynced, and folder entries
//   (creations, renames, exchanges) whose folder was not fsynced after them;
// - act like a file system without RENAME_EXCHANGE (NFS).
// Steps are the writing calls (file_system.h); reads are passed through and
// never counted. Thread-safe. Test-only: it truncates files with truncate(2)
// behind the wrapped file system, so that one must be the real one.
#ifndef ATTNSERVE_SERVER_REPOSITORY_FAULT_INJECTION_FILE_SYSTEM_H_
#define ATTNSERVE_SERVER_REPOSITORY_FAULT_INJECTION_FILE_SYSTEM_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/repository/file_system.h"

namespace attnserve {

class FaultInjectionFileSystem : public FileSystem {
 public:
  enum class Op {
    kNewFile, kAppend, kSync, kClose, kCreateDir, kSyncDir, kRename,
    kExchange, kRemoveFile, kRemoveDir,
    // A scratch file's creation and writes: steps a fault may fail, with no
    // part in what a power cut keeps (the file has no name).
    kNewScratchFile, kWriteAt,
  };
  struct Step {
    int index;         // 0 for the first step since construction
    Op op;
    std::string path;  // the file or folder (a rename's source)
  };
  static const char* OpName(Op op);

  // `base` is not owned and must outlive this.
  explicit FaultInjectionFileSystem(FileSystem* base) : base_(base) {}

  // Asked before each step; a nonzero errno fails it and nothing is done.
  // Called with this object's lock held: it must not call back into it.
  void SetFault(std::function<int(const Step&)> fault);
  // Steps with index >= `steps` are not run: ABORTED "simulated crash".
  void CrashAfter(int steps);
  // Exchange answers UNIMPLEMENTED (after counting its step), as on NFS.
  void SetExchangeUnsupported(bool unsupported);

  // Steps attempted so far (run, failed or refused by the crash).
  int steps() const;
  // Whether a step was refused by CrashAfter.
  bool crashed() const;
  std::vector<Step> log() const;

  // Makes the disk what a power cut now would leave: files cut back to their
  // last fsync, and entries not yet made durable by an fsync of their folder
  // undone, newest first (a removal is kept: what would come back is a
  // leftover). Clears the record; the first error of the real file system.
  absl::Status DropUnsyncedData();

  absl::StatusOr<std::string> ReadFile(const std::string& path,
                                       int64_t max_bytes) override;
  absl::StatusOr<std::shared_ptr<const FileBytes>> MapFile(
      const std::string& path, int64_t max_bytes) override;
  absl::StatusOr<std::vector<Entry>> ListDir(const std::string& path) override;
  absl::StatusOr<Entry> Stat(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ScratchFile>> NewScratchFile(
      const std::string& dir) override;

 private:
  class File;
  class Scratch;

  // A folder entry made (paths as they were then), durable once its
  // folder is fsynced after it.
  struct Pending {
    Op op;          // kNewFile, kCreateDir, kRename or kExchange
    std::string a;  // the created entry; a rename's or exchange's first
    std::string b;  // a rename's target, an exchange's second
    bool durable = false;
    bool undone = false;
  };
  // What was written to a file, and how much of it was fsynced.
  struct Written {
    std::string path;
    size_t size = 0;
    size_t synced = 0;
  };

  // Counts a step; the crash or injected fault that refuses it, if any.
  absl::Status BeginStep(Op op, const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Renames every written file's path under `from` to under `to` (both
  // ways at once when `swap`).
  void MovePaths(const std::string& from, const std::string& to, bool swap)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where what was at `path` just after pending_[index] is now: moved by
  // every later rename and exchange not undone. Renames and exchanges are
  // taken to stay within one folder (the repository's are).
  std::string Through(std::string path, size_t index) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FileSystem* const base_;
  mutable absl::Mutex mu_;
  std::function<int(const Step&)> fault_ ABSL_GUARDED_BY(mu_);
  int crash_after_ ABSL_GUARDED_BY(mu_) = -1;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  bool exchange_unsupported_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Step> log_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Written> written_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_FAULT_INJECTION_FILE_SYSTEM_H_
