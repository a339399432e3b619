// The accept guard against a real listening socket on loopback, with this
// process's fd limit lowered so that a few hundred connections fill it.
#include "server/process/accept_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

class AcceptGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0);
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ASSERT_GE(listener_, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&address),
                   sizeof(address)),
              0);
    ASSERT_EQ(listen(listener_, 4096), 0);
    socklen_t length = sizeof(address);
    ASSERT_EQ(getsockname(listener_, reinterpret_cast<sockaddr*>(&address),
                          &length),
              0);
    address_ = address;
  }

  void TearDown() override {
    InstallAcceptGuard(0);
    for (int fd : accepted_) close(fd);
    for (int fd : clients_) close(fd);
    close(listener_);
    setrlimit(RLIMIT_NOFILE, &saved_);
  }

  // Opens `count` client connections (they wait in the listener's backlog).
  void Connect(int count) {
    for (int i = 0; i < count; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      ASSERT_GE(fd, 0) << "client socket " << i << ": " << errno;
      ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address_),
                        sizeof(address_)),
                0);
      clients_.push_back(fd);
    }
  }

  // The lowest descriptor free now (what the next accept would get).
  static int LowestFree() {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    close(fd);
    return fd;
  }

  void LowerSoftLimit(rlim_t soft) {
    rlimit limits = saved_;
    limits.rlim_cur = soft;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limits), 0);
  }

  // Accepts until the guard says EAGAIN; returns the errno that ended it.
  int AcceptAll() {
    for (;;) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return errno;
      accepted_.push_back(fd);
    }
  }

  rlimit saved_{};
  int listener_ = -1;
  sockaddr_in address_{};
  std::vector<int> clients_;
  std::vector<int> accepted_;
};

TEST_F(AcceptGuardTest, RefusesConnectionsThatWouldEatTheReserve) {
  Connect(300);
  const int first_free = LowestFree();
  LowerSoftLimit(first_free + 100);
  const int64_t refused_before = ConnectionsRefusedByAcceptGuard();
  EXPECT_EQ(InstallAcceptGuard(20), 20);

  EXPECT_EQ(AcceptAll(), EAGAIN);
  // Accepted up to the reserve (the guard's spare took one descriptor),
  // the rest refused: every pending connection taken, none left waiting.
  EXPECT_GT(accepted_.size(), 70u);
  EXPECT_LE(accepted_.size(), 80u);
  EXPECT_EQ(ConnectionsRefusedByAcceptGuard() - refused_before,
            static_cast<int64_t>(300 - accepted_.size()));
  EXPECT_GE(first_free + 100 - LowestFree(), 20) << "the reserve was eaten";
}

TEST_F(AcceptGuardTest, ServesAgainOnceDescriptorsAreFree) {
  Connect(200);
  LowerSoftLimit(LowestFree() + 60);
  InstallAcceptGuard(10);
  EXPECT_EQ(AcceptAll(), EAGAIN);
  ASSERT_FALSE(accepted_.empty());
  for (int fd : accepted_) close(fd);
  accepted_.clear();

  Connect(5);
  EXPECT_EQ(AcceptAll(), EAGAIN);
  EXPECT_EQ(accepted_.size(), 5u);
}

// Without a reserve the table really fills: EMFILE must still never reach
// the caller (gRPC 1.51's listener stops for good on it), and pending
// connections must not be left in the backlog.
TEST_F(AcceptGuardTest, NeverReturnsEmfile) {
  Connect(120);
  const int first_free = LowestFree();
  LowerSoftLimit(first_free + 30);
  const int64_t refused_before = ConnectionsRefusedByAcceptGuard();
  InstallAcceptGuard(0);
  EXPECT_EQ(AcceptAll(), EAGAIN);
  EXPECT_GE(accepted_.size(), 28u);
  EXPECT_EQ(ConnectionsRefusedByAcceptGuard() - refused_before,
            static_cast<int64_t>(120 - accepted_.size()));
  for (int fd : accepted_) close(fd);
  accepted_.clear();
  Connect(3);
  EXPECT_EQ(AcceptAll(), EAGAIN);
  EXPECT_EQ(accepted_.size(), 3u);
}

TEST_F(AcceptGuardTest, ReservesAtMostHalfTheLimit) {
  LowerSoftLimit(LowestFree() + 100);
  rlimit limits{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limits), 0);
  EXPECT_EQ(InstallAcceptGuard(1 << 20), static_cast<int>(limits.rlim_cur / 2));
}

TEST(RaiseFdLimitTest, RaisesTheSoftLimitToTheHardLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit lowered = saved;
  lowered.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const absl::StatusOr<FdLimit> raised = RaiseFdLimit();
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_EQ(raised->soft_before, 256);
  EXPECT_EQ(raised->soft, raised->hard);
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(static_cast<int64_t>(now.rlim_cur), raised->hard);
  setrlimit(RLIMIT_NOFILE, &saved);
}

}  // namespace
}  // namespace attnserve
