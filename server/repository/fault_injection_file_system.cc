#include "server/repository/fault_injection_file_system.h"

#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// `path` with its prefix `from` (the path itself or a folder above it)
// replaced by `to`; false if `from` is not such a prefix.
bool Moved(const std::string& path, const std::string& from,
           const std::string& to, std::string* out) {
  if (path == from) {
    *out = to;
    return true;
  }
  if (absl::StartsWith(path, from + "/")) {
    *out = to + path.substr(from.size());
    return true;
  }
  return false;
}

}  // namespace

const char* FaultInjectionFileSystem::OpName(Op op) {
  switch (op) {
    case Op::kNewFile: return "create";
    case Op::kAppend: return "write";
    case Op::kSync: return "fsync";
    case Op::kClose: return "close";
    case Op::kCreateDir: return "mkdir";
    case Op::kSyncDir: return "fsync(folder)";
    case Op::kRename: return "rename";
    case Op::kExchange: return "exchange";
    case Op::kRemoveFile: return "unlink";
    case Op::kRemoveDir: return "rmdir";
    case Op::kNewScratchFile: return "create(scratch)";
    case Op::kWriteAt: return "pwrite";
  }
  return "?";
}

class FaultInjectionFileSystem::File : public WritableFile {
 public:
  File(FaultInjectionFileSystem* fs, std::unique_ptr<WritableFile> base,
       size_t index)
      : fs_(fs), base_(std::move(base)), index_(index) {}

  absl::Status Append(absl::string_view data) override {
    absl::MutexLock lock(&fs_->mu_);
    absl::Status status = fs_->BeginStep(Op::kAppend, Path());
    if (!status.ok()) return status;
    status = base_->Append(data);
    if (status.ok()) fs_->written_[index_].size += data.size();
    return status;
  }
  absl::Status Sync() override {
    absl::MutexLock lock(&fs_->mu_);
    absl::Status status = fs_->BeginStep(Op::kSync, Path());
    if (!status.ok()) return status;
    status = base_->Sync();
    if (status.ok()) {
      fs_->written_[index_].synced = fs_->written_[index_].size;
    }
    return status;
  }
  absl::Status Close() override {
    absl::MutexLock lock(&fs_->mu_);
    absl::Status status = fs_->BeginStep(Op::kClose, Path());
    if (!status.ok()) return status;
    return base_->Close();
  }

 private:
  std::string Path() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fs_->mu_) {
    return fs_->written_[index_].path;
  }

  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<WritableFile> base_;
  const size_t index_;
};

class FaultInjectionFileSystem::Scratch : public ScratchFile {
 public:
  Scratch(FaultInjectionFileSystem* fs, std::unique_ptr<ScratchFile> base,
          std::string dir)
      : fs_(fs), base_(std::move(base)), dir_(std::move(dir)) {}

  absl::Status WriteAt(int64_t offset, absl::string_view data) override {
    absl::MutexLock lock(&fs_->mu_);
    absl::Status status = fs_->BeginStep(Op::kWriteAt, dir_);
    if (!status.ok()) return status;
    return base_->WriteAt(offset, data);
  }
  absl::StatusOr<std::shared_ptr<const uint8_t>> Map(int64_t length) override {
    return base_->Map(length);
  }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<ScratchFile> base_;
  const std::string dir_;  // the steps' path
};

void FaultInjectionFileSystem::SetFault(std::function<int(const Step&)> fault) {
  absl::MutexLock lock(&mu_);
  fault_ = std::move(fault);
}

void FaultInjectionFileSystem::CrashAfter(int steps) {
  absl::MutexLock lock(&mu_);
  crash_after_ = steps;
}

void FaultInjectionFileSystem::SetExchangeUnsupported(bool unsupported) {
  absl::MutexLock lock(&mu_);
  exchange_unsupported_ = unsupported;
}

int FaultInjectionFileSystem::steps() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(log_.size());
}

bool FaultInjectionFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

std::vector<FaultInjectionFileSystem::Step> FaultInjectionFileSystem::log()
    const {
  absl::MutexLock lock(&mu_);
  return log_;
}

absl::Status FaultInjectionFileSystem::BeginStep(Op op, const std::string& path) {
  const Step step{static_cast<int>(log_.size()), op, path};
  log_.push_back(step);
  if (crashed_ || (crash_after_ >= 0 && step.index >= crash_after_)) {
    crashed_ = true;
    return absl::AbortedError(
        absl::StrCat("simulated crash before ", OpName(op)));
  }
  if (fault_) {
    if (const int error = fault_(step); error != 0) {
      return FileSystemError(OpName(op), error);
    }
  }
  return absl::OkStatus();
}

void FaultInjectionFileSystem::MovePaths(const std::string& from,
                                         const std::string& to, bool swap) {
  auto move = [&](std::string& path) {
    std::string moved;
    if (Moved(path, from, to, &moved) || (swap && Moved(path, to, from, &moved))) {
      path = std::move(moved);
    }
  };
  for (Written& written : written_) move(written.path);
}

std::string FaultInjectionFileSystem::Through(std::string path,
                                              size_t index) const {
  for (size_t i = index + 1; i < pending_.size(); ++i) {
    const Pending& later = pending_[i];
    if (later.undone) continue;
    std::string moved;
    if (later.op == Op::kRename && Moved(path, later.a, later.b, &moved)) {
      path = std::move(moved);
    } else if (later.op == Op::kExchange &&
               (Moved(path, later.a, later.b, &moved) ||
                Moved(path, later.b, later.a, &moved))) {
      path = std::move(moved);
    }
  }
  return path;
}

absl::Status FaultInjectionFileSystem::DropUnsyncedData() {
  absl::MutexLock lock(&mu_);
  absl::Status first;
  auto keep_first = [&first](absl::Status status) {
    if (!status.ok() && !absl::IsNotFound(status) && first.ok()) first = status;
  };
  for (const Written& written : written_) {
    if (written.path.empty() || written.synced == written.size) continue;
    if (::truncate(written.path.c_str(), static_cast<off_t>(written.synced)) != 0 &&
        errno != ENOENT) {
      keep_first(FileSystemError("truncate", errno));
    }
  }
  for (size_t i = pending_.size(); i-- > 0;) {
    Pending& pending = pending_[i];
    if (pending.durable) continue;
    pending.undone = true;
    switch (pending.op) {
      case Op::kNewFile:
        keep_first(base_->RemoveFile(Through(pending.a, i)));
        break;
      case Op::kCreateDir:
        keep_first(RemoveTree(*base_, Through(pending.a, i)));
        break;
      case Op::kRename:
        keep_first(base_->Rename(Through(pending.b, i), pending.a));
        break;
      case Op::kExchange:
        keep_first(base_->Exchange(Through(pending.a, i), Through(pending.b, i)));
        break;
      default:
        break;
    }
  }
  pending_.clear();
  written_.clear();
  return first;
}

absl::StatusOr<std::string> FaultInjectionFileSystem::ReadFile(
    const std::string& path, int64_t max_bytes) {
  return base_->ReadFile(path, max_bytes);
}

absl::StatusOr<std::shared_ptr<const FileBytes>>
FaultInjectionFileSystem::MapFile(const std::string& path, int64_t max_bytes) {
  return base_->MapFile(path, max_bytes);
}

absl::StatusOr<std::vector<FileSystem::Entry>> FaultInjectionFileSystem::ListDir(
    const std::string& path) {
  return base_->ListDir(path);
}

absl::StatusOr<FileSystem::Entry> FaultInjectionFileSystem::Stat(
    const std::string& path) {
  return base_->Stat(path);
}

absl::StatusOr<std::unique_ptr<WritableFile>>
FaultInjectionFileSystem::NewWritableFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kNewFile, path);
  if (!status.ok()) return status;
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      base_->NewWritableFile(path);
  if (!file.ok()) return file.status();
  pending_.push_back(Pending{Op::kNewFile, path, ""});
  written_.push_back(Written{path, 0, 0});
  return std::unique_ptr<WritableFile>(
      new File(this, *std::move(file), written_.size() - 1));
}

absl::Status FaultInjectionFileSystem::CreateDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kCreateDir, path);
  if (!status.ok()) return status;
  status = base_->CreateDir(path);
  if (status.ok()) pending_.push_back(Pending{Op::kCreateDir, path, ""});
  return status;
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kSyncDir, path);
  if (!status.ok()) return status;
  status = base_->SyncDir(path);
  if (!status.ok()) return status;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& pending = pending_[i];
    // A rename's source is gone; its target's folder is the one.
    const std::string& entry = pending.op == Op::kRename ? pending.b : pending.a;
    if (Parent(Through(entry, i)) == path) pending.durable = true;
  }
  return status;
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from,
                                              const std::string& to) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kRename, from);
  if (!status.ok()) return status;
  status = base_->Rename(from, to);
  if (!status.ok()) return status;
  MovePaths(from, to, /*swap=*/false);
  pending_.push_back(Pending{Op::kRename, from, to});
  return status;
}

absl::Status FaultInjectionFileSystem::Exchange(const std::string& a,
                                                const std::string& b) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kExchange, a);
  if (!status.ok()) return status;
  if (exchange_unsupported_) {
    return absl::UnimplementedError(
        "renameat2(RENAME_EXCHANGE): Invalid argument (simulated)");
  }
  status = base_->Exchange(a, b);
  if (!status.ok()) return status;
  MovePaths(a, b, /*swap=*/true);
  pending_.push_back(Pending{Op::kExchange, a, b});
  return status;
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kRemoveFile, path);
  if (!status.ok()) return status;
  status = base_->RemoveFile(path);
  if (status.ok()) {
    for (Written& written : written_) {
      if (written.path == path) written.path.clear();
    }
  }
  return status;
}

absl::Status FaultInjectionFileSystem::RemoveDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kRemoveDir, path);
  if (!status.ok()) return status;
  return base_->RemoveDir(path);
}

absl::StatusOr<std::unique_ptr<ScratchFile>>
FaultInjectionFileSystem::NewScratchFile(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  absl::Status status = BeginStep(Op::kNewScratchFile, dir);
  if (!status.ok()) return status;
  absl::StatusOr<std::unique_ptr<ScratchFile>> file = base_->NewScratchFile(dir);
  if (!file.ok()) return file.status();
  return std::unique_ptr<ScratchFile>(new Scratch(this, *std::move(file), dir));
}

}  // namespace attnserve
