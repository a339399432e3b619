// The POSIX file system behind the repository (errno codes, RENAME_EXCHANGE
// on this machine's file systems) and the fault-injecting one its tests use.
#include "server/repository/file_system.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/repository/fault_injection_file_system.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  char pattern[] = "/tmp/attnserve-fs-XXXXXX";
  return mkdtemp(pattern);
}

void WriteFile(FileSystem& fs, const std::string& path, const std::string& bytes,
               bool sync) {
  auto file = fs.NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append(bytes).ok());
  if (sync) {
    ASSERT_TRUE((*file)->Sync().ok());
  }
  ASSERT_TRUE((*file)->Close().ok());
}

TEST(FileSystemErrorTest, ErrnoDecidesTheCode) {
  EXPECT_TRUE(absl::IsResourceExhausted(FileSystemError("write", ENOSPC)));
  EXPECT_TRUE(absl::IsResourceExhausted(FileSystemError("write", EDQUOT)));
  EXPECT_TRUE(absl::IsFailedPrecondition(FileSystemError("mkdir", EROFS)));
  EXPECT_TRUE(absl::IsFailedPrecondition(FileSystemError("mkdir", EACCES)));
  EXPECT_TRUE(absl::IsNotFound(FileSystemError("open", ENOENT)));
  EXPECT_TRUE(absl::IsAlreadyExists(FileSystemError("mkdir", EEXIST)));
  EXPECT_TRUE(absl::IsInternal(FileSystemError("fsync", EIO)));
  EXPECT_EQ(FileSystemError("close", EIO).message(), "close: Input/output error");
}

// Exchanges two folders and checks that each holds the other's file.
void ExpectExchangeWorks(const std::string& dir) {
  FileSystem& fs = *DefaultFileSystem();
  ASSERT_TRUE(fs.CreateDir(dir + "/a").ok());
  ASSERT_TRUE(fs.CreateDir(dir + "/b").ok());
  WriteFile(fs, dir + "/a/x", "from a", true);
  WriteFile(fs, dir + "/b/y", "from b", true);
  const absl::Status exchanged = fs.Exchange(dir + "/a", dir + "/b");
  ASSERT_TRUE(exchanged.ok()) << exchanged;
  EXPECT_EQ(fs.ReadFile(dir + "/b/x").value(), "from a");
  EXPECT_EQ(fs.ReadFile(dir + "/a/y").value(), "from b");
  EXPECT_TRUE(fs.SyncDir(dir).ok());
  EXPECT_TRUE(RemoveTree(fs, dir + "/a").ok());
  EXPECT_TRUE(absl::IsNotFound(fs.Stat(dir + "/a").status()));
}

TEST(PosixFileSystemTest, ExchangeWorksOnTheTestFolder) {
  ExpectExchangeWorks(TempDir());
}

TEST(PosixFileSystemTest, ExchangeWorksOnTmpfs) {
  // make test runs as root (deploy/install_deps.sh needs it), as CI does.
  if (geteuid() != 0) FAIL() << "mounting a tmpfs needs root";
  const std::string dir = TempDir();
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
    FAIL() << "mount -t tmpfs failed: " << std::strerror(errno);
  }
  ExpectExchangeWorks(dir);
  EXPECT_EQ(umount2(dir.c_str(), MNT_DETACH), 0);
}

TEST(PosixFileSystemTest, CallsFailWithTheirErrno) {
  FileSystem& fs = *DefaultFileSystem();
  const std::string dir = TempDir();
  EXPECT_TRUE(absl::IsNotFound(fs.ReadFile(dir + "/absent").status()));
  ASSERT_TRUE(fs.CreateDir(dir + "/d").ok());
  EXPECT_TRUE(absl::IsAlreadyExists(fs.CreateDir(dir + "/d")));
  WriteFile(fs, dir + "/f", "x", true);
  EXPECT_TRUE(absl::IsAlreadyExists(fs.NewWritableFile(dir + "/f").status()));
  // Exchange needs both to exist.
  EXPECT_TRUE(absl::IsNotFound(fs.Exchange(dir + "/d", dir + "/none")));
  // A link to a folder is removed, never followed.
  WriteFile(fs, dir + "/d/kept", "x", true);
  ASSERT_EQ(symlink((dir + "/d").c_str(), (dir + "/link").c_str()), 0);
  EXPECT_TRUE(fs.Stat(dir + "/link")->is_dir);
  EXPECT_TRUE(fs.Stat(dir + "/link")->is_symlink);
  ASSERT_TRUE(RemoveTree(fs, dir + "/link").ok());
  EXPECT_TRUE(fs.ReadFile(dir + "/d/kept").ok());
}

// A file over the read's limit is refused before it is read whole: the
// weights of a model over --max_model_bytes never fill the server's memory.
TEST(PosixFileSystemTest, ReadFileStopsAtItsLimit) {
  const std::string dir = TempDir();
  const std::string path = dir + "/f";
  std::ofstream(path, std::ios::binary) << std::string(100, 'x');
  FileSystem& fs = *DefaultFileSystem();
  EXPECT_EQ(fs.ReadFile(path, 100).value().size(), 100u);
  const absl::StatusOr<std::string> over = fs.ReadFile(path, 99);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()),
              ::testing::HasSubstr("100 bytes or more, over the limit of 99"));
  EXPECT_EQ(fs.ReadFile(path).value().size(), 100u);
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

TEST(FaultInjectionFileSystemTest, InjectsErrnoAndCrashes) {
  const std::string dir = TempDir();
  FaultInjectionFileSystem fs(DefaultFileSystem());
  fs.SetFault([](const FaultInjectionFileSystem::Step& step) {
    return step.op == FaultInjectionFileSystem::Op::kAppend ? ENOSPC : 0;
  });
  auto file = fs.NewWritableFile(dir + "/f");
  ASSERT_TRUE(file.ok());
  const absl::Status full = (*file)->Append("x");
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr("No space left"));
  fs.SetFault(nullptr);
  fs.CrashAfter(fs.steps());
  EXPECT_TRUE(absl::IsAborted(fs.CreateDir(dir + "/d")));
  EXPECT_TRUE(fs.crashed());
  EXPECT_TRUE(absl::IsNotFound(fs.Stat(dir + "/d").status()));
}

// A power cut loses data not fsynced and entries whose folder was not
// fsynced after them, whatever was renamed since.
TEST(FaultInjectionFileSystemTest, DropsWhatWasNotSynced) {
  const std::string dir = TempDir();
  FileSystem& real = *DefaultFileSystem();
  FaultInjectionFileSystem fs(&real);
  ASSERT_TRUE(fs.CreateDir(dir + "/kept").ok());
  WriteFile(fs, dir + "/kept/synced", "durable", true);
  WriteFile(fs, dir + "/kept/unsynced", "lost", false);
  ASSERT_TRUE(fs.SyncDir(dir + "/kept").ok());
  ASSERT_TRUE(fs.SyncDir(dir).ok());
  ASSERT_TRUE(fs.CreateDir(dir + "/new").ok());  // its parent never synced
  ASSERT_TRUE(fs.Rename(dir + "/kept", dir + "/moved").ok());  // nor here
  ASSERT_TRUE(fs.DropUnsyncedData().ok());
  EXPECT_TRUE(absl::IsNotFound(real.Stat(dir + "/new").status()));
  EXPECT_TRUE(absl::IsNotFound(real.Stat(dir + "/moved").status()));
  EXPECT_EQ(real.ReadFile(dir + "/kept/synced").value(), "durable");
  EXPECT_EQ(real.ReadFile(dir + "/kept/unsynced").value(), "");
}

}  // namespace
}  // namespace attnserve
