// Files mapped under a read lease (server/repository/mapped_file.h), through
// the POSIX file system's MapFile: mapped without a copy, and kept whole
// when the file is truncated or rewritten in place under readers, which a
// plain mapping would answer with SIGBUS or changed values.
#include "server/repository/mapped_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/repository/file_system.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/attnserve-map-XXXXXX";
    dir_ = mkdtemp(pattern);
    path_ = dir_ + "/weights.safetensors";
    // Several pages, none of them alike.
    bytes_.resize(3 * 4096 + 123);
    for (size_t i = 0; i < bytes_.size(); ++i) {
      bytes_[i] = static_cast<char>((i * 131) ^ (i >> 8));
    }
    Write(bytes_);
  }
  void TearDown() override {
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  void Write(const std::string& bytes) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::shared_ptr<const FileBytes> Map() {
    absl::StatusOr<std::shared_ptr<const FileBytes>> mapped =
        DefaultFileSystem()->MapFile(path_);
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    return mapped.ok() ? *mapped : nullptr;
  }
  // Whether a writer may open the file now: false while a lease is held
  // (the open fails at once with EWOULDBLOCK, and asks for the lease).
  bool WriterMayOpen() {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
    EXPECT_TRUE(fd >= 0 || errno == EWOULDBLOCK) << std::strerror(errno);
    return fd >= 0;
  }
  off_t SizeOnDisk() {
    struct stat info;
    return ::stat(path_.c_str(), &info) == 0 ? info.st_size : -1;
  }

  std::string dir_;
  std::string path_;
  std::string bytes_;
};

TEST_F(MappedFileTest, MapsTheFileUnderALease) {
  std::shared_ptr<const FileBytes> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->why_copied(), "");
  EXPECT_EQ(mapped->bytes(), bytes_);
  EXPECT_FALSE(WriterMayOpen());
  // The refused open asked for the lease: the keeper copied the bytes and
  // let go, and they are still the same.
  EXPECT_EQ(mapped->bytes(), bytes_);
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);  // waits
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ::close(fd);
}

TEST_F(MappedFileTest, FreeingTheBytesReleasesTheLease) {
  std::shared_ptr<const FileBytes> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  mapped.reset();
  EXPECT_TRUE(WriterMayOpen());
}

TEST_F(MappedFileTest, ATruncatedFileKeepsItsBytes) {
  std::shared_ptr<const FileBytes> first = Map();
  std::shared_ptr<const FileBytes> second = Map();  // another replica's
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(::truncate(path_.c_str(), 0), 0) << std::strerror(errno);
  EXPECT_EQ(SizeOnDisk(), 0);
  // A plain mapping raises SIGBUS here.
  EXPECT_EQ(first->bytes(), bytes_);
  EXPECT_EQ(second->bytes(), bytes_);
}

TEST_F(MappedFileTest, AFileRewrittenInPlaceKeepsItsBytes) {
  std::shared_ptr<const FileBytes> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  const std::string other(bytes_.size(), 'x');
  {
    std::fstream out(path_, std::ios::binary | std::ios::in | std::ios::out);
    out.write(other.data(), static_cast<std::streamsize>(other.size()));
  }
  EXPECT_EQ(DefaultFileSystem()->ReadFile(path_).value(), other);
  EXPECT_EQ(mapped->bytes(), bytes_);
}

// Readers that scan the bytes while the file is truncated under them see
// the same bytes on every pass: the copy takes the mapping's place at once.
TEST_F(MappedFileTest, ReadersSeeTheSameBytesWhileTheFileIsTruncated) {
  std::shared_ptr<const FileBytes> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  const uint64_t expected =
      std::accumulate(bytes_.begin(), bytes_.end(), uint64_t{0},
                      [](uint64_t sum, char c) {
                        return sum * 31 + static_cast<unsigned char>(c);
                      });
  std::atomic<bool> running{true};
  std::atomic<int> passes{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (running.load()) {
        const absl::string_view bytes = mapped->bytes();
        uint64_t sum = 0;
        for (char c : bytes) sum = sum * 31 + static_cast<unsigned char>(c);
        if (sum != expected) wrong.fetch_add(1);
        passes.fetch_add(1);
      }
    });
  }
  while (passes.load() < 20) std::this_thread::yield();
  ASSERT_EQ(::truncate(path_.c_str(), 100), 0) << std::strerror(errno);
  const int after = passes.load();
  while (passes.load() < after + 20) std::this_thread::yield();
  running.store(false);
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(SizeOnDisk(), 100);
}

TEST_F(MappedFileTest, AFileOpenForWritingIsReadInstead) {
  const int writer = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(writer, 0);
  std::shared_ptr<const FileBytes> copied = Map();
  ::close(writer);
  ASSERT_NE(copied, nullptr);
  EXPECT_THAT(copied->why_copied(),
              HasSubstr("another process holds the file open for writing"));
  EXPECT_EQ(copied->bytes(), bytes_);
  EXPECT_TRUE(WriterMayOpen());  // no lease was kept
}

TEST_F(MappedFileTest, EmptyAndTooLargeFiles) {
  absl::StatusOr<std::shared_ptr<const FileBytes>> too_large =
      DefaultFileSystem()->MapFile(path_, 4096);
  EXPECT_TRUE(absl::IsResourceExhausted(too_large.status()))
      << too_large.status();
  EXPECT_TRUE(WriterMayOpen());
  Write("");
  std::shared_ptr<const FileBytes> empty = Map();
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->bytes(), "");
  EXPECT_EQ(empty->why_copied(), "the file is empty");
  EXPECT_TRUE(absl::IsNotFound(
      DefaultFileSystem()->MapFile(dir_ + "/missing").status()));
}

}  // namespace
}  // namespace attnserve
