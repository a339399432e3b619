#include "server/repository/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/repository/mapped_file.h"

namespace attnserve {

absl::Status FileSystemError(absl::string_view call, int error) {
  const std::string message = absl::StrCat(call, ": ", std::strerror(error));
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EROFS:
    case EACCES:
    case EPERM:
      return absl::FailedPreconditionError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

// A file read into the process's own memory.
class CopiedFileBytes : public FileBytes {
 public:
  CopiedFileBytes(std::string bytes, std::string why_copied)
      : CopiedFileBytes(std::make_unique<std::string>(std::move(bytes)),
                        std::move(why_copied)) {}

 private:
  CopiedFileBytes(std::unique_ptr<std::string> bytes, std::string why_copied)
      : FileBytes(*bytes, std::move(why_copied)), bytes_(std::move(bytes)) {}

  const std::unique_ptr<std::string> bytes_;
};

}  // namespace

std::shared_ptr<const FileBytes> FileBytesInMemory(std::string bytes,
                                                   std::string why) {
  return std::make_shared<const CopiedFileBytes>(std::move(bytes),
                                                 std::move(why));
}

absl::StatusOr<std::shared_ptr<const FileBytes>> FileSystem::MapFile(
    const std::string& path, int64_t max_bytes) {
  absl::StatusOr<std::string> bytes = ReadFile(path, max_bytes);
  if (!bytes.ok()) return bytes.status();
  return std::shared_ptr<const FileBytes>(new CopiedFileBytes(
      *std::move(bytes), "this file system does not map files"));
}

absl::StatusOr<std::unique_ptr<ScratchFile>> FileSystem::NewScratchFile(
    const std::string&) {
  return absl::UnimplementedError("this file system keeps no scratch files");
}

namespace {

class PosixScratchFile : public ScratchFile {
 public:
  explicit PosixScratchFile(int fd) : fd_(fd) {}
  ~PosixScratchFile() override { ::close(fd_); }

  absl::Status WriteAt(int64_t offset, absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t written =
          ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
      if (written < 0) {
        if (errno == EINTR) continue;
        return FileSystemError("pwrite", errno);
      }
      data.remove_prefix(static_cast<size_t>(written));
      offset += written;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<const uint8_t>> Map(int64_t length) override {
    const size_t bytes = static_cast<size_t>(length);
    void* at = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd_, 0);
    if (at == MAP_FAILED) return FileSystemError("mmap", errno);
    return std::shared_ptr<const uint8_t>(
        static_cast<const uint8_t*>(at), [bytes](const uint8_t* mapped) {
          ::munmap(const_cast<uint8_t*>(mapped), bytes);
        });
  }

 private:
  const int fd_;
};

class PosixWritableFile : public WritableFile {
 public:
  explicit PosixWritableFile(int fd) : fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t written = ::write(fd_, data.data(), data.size());
      if (written < 0) {
        if (errno == EINTR) continue;
        return FileSystemError("write", errno);
      }
      data.remove_prefix(static_cast<size_t>(written));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return FileSystemError("fsync", errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    // Linux frees the descriptor even when close fails: never retried.
    if (::close(fd) != 0) return FileSystemError("close", errno);
    return absl::OkStatus();
  }

 private:
  int fd_;
};

absl::Status TooLarge(int64_t size, int64_t max_bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat(size, " bytes or more, over the limit of ", max_bytes));
}

// The rest of the open file `fd`, stopping with RESOURCE_EXHAUSTED past
// `max_bytes` (at the fstat, or grown past it while read).
absl::StatusOr<std::string> ReadOpenFile(int fd, int64_t max_bytes) {
  struct stat info;
  if (::fstat(fd, &info) == 0 && info.st_size > max_bytes) {
    return TooLarge(info.st_size, max_bytes);
  }
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      return FileSystemError("read", errno);
    }
    if (got == 0) break;
    bytes.append(buffer, static_cast<size_t>(got));
    if (static_cast<int64_t>(bytes.size()) > max_bytes) {
      return TooLarge(static_cast<int64_t>(bytes.size()), max_bytes);
    }
  }
  return bytes;
}

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path,
                                       int64_t max_bytes) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return FileSystemError("open", errno);
    absl::StatusOr<std::string> bytes = ReadOpenFile(fd, max_bytes);
    ::close(fd);
    return bytes;
  }

  absl::StatusOr<std::shared_ptr<const FileBytes>> MapFile(
      const std::string& path, int64_t max_bytes) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return FileSystemError("open", errno);
    struct stat info;
    if (::fstat(fd, &info) != 0) {
      const int error = errno;
      ::close(fd);
      return FileSystemError("fstat", error);
    }
    if (info.st_size > max_bytes) {
      ::close(fd);
      return TooLarge(info.st_size, max_bytes);
    }
    std::string why_copied = "the file is empty";
    if (info.st_size > 0) {
      absl::StatusOr<std::shared_ptr<const FileBytes>> mapped =
          MapUnderLease(fd, info.st_size, path);
      if (mapped.ok()) return mapped;  // it owns fd now
      why_copied = std::string(mapped.status().message());
    }
    absl::StatusOr<std::string> bytes = ReadOpenFile(fd, max_bytes);
    ::close(fd);
    if (!bytes.ok()) return bytes.status();
    return std::shared_ptr<const FileBytes>(
        new CopiedFileBytes(*std::move(bytes), std::move(why_copied)));
  }

  absl::StatusOr<std::vector<Entry>> ListDir(const std::string& path) override {
    DIR* handle = ::opendir(path.c_str());
    if (handle == nullptr) return FileSystemError("opendir", errno);
    std::vector<Entry> entries;
    while (dirent* entry = ::readdir(handle)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      absl::StatusOr<Entry> info = Stat(path + "/" + name);
      if (!info.ok()) continue;  // gone since readdir
      info->name = name;
      entries.push_back(*std::move(info));
    }
    ::closedir(handle);
    return entries;
  }

  absl::StatusOr<Entry> Stat(const std::string& path) override {
    struct stat own;
    if (::lstat(path.c_str(), &own) != 0) return FileSystemError("lstat", errno);
    Entry entry;
    entry.is_symlink = S_ISLNK(own.st_mode);
    entry.modified = absl::TimeFromTimespec(own.st_mtim);
    struct stat target;
    entry.is_dir = entry.is_symlink
                       ? ::stat(path.c_str(), &target) == 0 &&
                             S_ISDIR(target.st_mode)
                       : S_ISDIR(own.st_mode);
    return entry;
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd = ::open(path.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return FileSystemError("open", errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd));
  }

  absl::StatusOr<std::unique_ptr<ScratchFile>> NewScratchFile(
      const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
      // No O_TMPFILE here (overlayfs before Linux 6.6, NFS): a hidden name,
      // gone at once; a kill in between leaves a leftover a start removes.
      static std::atomic<uint64_t> made{0};
      const std::string path = absl::StrCat(dir, "/.rows-scratch.tmp-",
                                            getpid(), "-", ++made);
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0 && ::unlink(path.c_str()) != 0) {
        const int error = errno;
        ::close(fd);
        return FileSystemError("unlink", error);
      }
    }
    if (fd < 0) return FileSystemError("open", errno);
    return std::unique_ptr<ScratchFile>(new PosixScratchFile(fd));
  }

  absl::Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return FileSystemError("mkdir", errno);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return FileSystemError("open", errno);
    if (::fsync(fd) != 0) {
      const int error = errno;
      ::close(fd);
      return FileSystemError("fsync", error);
    }
    if (::close(fd) != 0) return FileSystemError("close", errno);
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return FileSystemError("rename", errno);
    }
    return absl::OkStatus();
  }

  absl::Status Exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(),
                    RENAME_EXCHANGE) != 0) {
      const int error = errno;
      // EINVAL: the file system has no RENAME_EXCHANGE; ENOSYS: the kernel.
      if (error == EINVAL || error == ENOSYS) {
        return absl::UnimplementedError(
            absl::StrCat("renameat2(RENAME_EXCHANGE): ", std::strerror(error)));
      }
      return FileSystemError("renameat2", error);
    }
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return FileSystemError("unlink", errno);
    return absl::OkStatus();
  }

  absl::Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return FileSystemError("rmdir", errno);
    return absl::OkStatus();
  }
};

}  // namespace

FileSystem* DefaultFileSystem() {
  static FileSystem* const fs = new PosixFileSystem();
  return fs;
}

absl::Status RemoveTree(FileSystem& fs, const std::string& path) {
  absl::StatusOr<FileSystem::Entry> entry = fs.Stat(path);
  if (!entry.ok()) return entry.status();
  if (entry->is_symlink || !entry->is_dir) return fs.RemoveFile(path);
  absl::StatusOr<std::vector<FileSystem::Entry>> children = fs.ListDir(path);
  if (!children.ok()) return children.status();
  for (const FileSystem::Entry& child : *children) {
    absl::Status removed = RemoveTree(fs, path + "/" + child.name);
    if (!removed.ok()) return removed;
  }
  return fs.RemoveDir(path);
}

}  // namespace attnserve
