#include "client/server_address.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Target(const std::vector<std::string>& args) {
  absl::StatusOr<std::string> target = ServerTargetFromArgs(args);
  EXPECT_TRUE(target.ok()) << target.status();
  return target.value_or("");
}

absl::Status Error(const std::vector<std::string>& args) {
  return ServerTargetFromArgs(args).status();
}

TEST(SplitProcCmdlineTest, SplitsAtNuls) {
  using namespace std::string_literals;
  EXPECT_THAT(SplitProcCmdline("/usr/local/bin/attnserve\0--grpc_port=9001\0"s),
              ElementsAre("/usr/local/bin/attnserve", "--grpc_port=9001"));
  // Without the final NUL, and with an empty argument kept in place.
  EXPECT_THAT(SplitProcCmdline("a\0\0b"s), ElementsAre("a", "", "b"));
  EXPECT_THAT(SplitProcCmdline(""), IsEmpty());
}

TEST(ServerTargetFromArgsTest, DefaultsAreAttnservesOwn) {
  EXPECT_EQ(Target({"/usr/local/bin/attnserve"}), "127.0.0.1:8001");
  EXPECT_EQ(Target({"/usr/local/bin/attnserve", "--model_repository=/models"}),
            "127.0.0.1:8001");
}

TEST(ServerTargetFromArgsTest, ReadsEveryFlagSpelling) {
  EXPECT_EQ(Target({"attnserve", "--grpc_port=9001"}), "127.0.0.1:9001");
  EXPECT_EQ(Target({"attnserve", "--grpc_port", "9002"}), "127.0.0.1:9002");
  EXPECT_EQ(Target({"attnserve", "-grpc_port=9003"}), "127.0.0.1:9003");
  EXPECT_EQ(Target({"attnserve", "-grpc_port", "9004", "--batching"}),
            "127.0.0.1:9004");
  EXPECT_EQ(Target({"attnserve", "--host", "10.1.2.3", "--grpc_port=1"}),
            "10.1.2.3:1");
}

TEST(ServerTargetFromArgsTest, LastFlagWins) {
  EXPECT_EQ(Target({"attnserve", "--grpc_port=9001", "--grpc_port=9002"}),
            "127.0.0.1:9002");
}

TEST(ServerTargetFromArgsTest, OtherFlagsAndTheirValuesAreNotPorts) {
  // A value that merely mentions the flag, and flags that share a prefix.
  EXPECT_EQ(Target({"attnserve", "--model_repository=--grpc_port=1",
                    "--grpc_port_extra=5", "--metrics_port=9002"}),
            "127.0.0.1:8001");
  // argv[0] is never a flag.
  EXPECT_EQ(Target({"--grpc_port=7"}), "127.0.0.1:8001");
}

TEST(ServerTargetFromArgsTest, SeesThroughAnInitWrapper) {
  // docker run --init / tini: PID 1 is the init, attnserve's flags follow --.
  EXPECT_EQ(Target({"/sbin/docker-init", "--", "/usr/local/bin/attnserve",
                    "--model_repository=/models", "--grpc_port=9001"}),
            "127.0.0.1:9001");
}

TEST(ServerTargetFromArgsTest, WildcardHostsAreReachedOverLoopback) {
  EXPECT_EQ(Target({"attnserve", "--host=0.0.0.0"}), "127.0.0.1:8001");
  EXPECT_EQ(Target({"attnserve", "--host=[::]"}), "[::1]:8001");
  EXPECT_EQ(Target({"attnserve", "--host=::"}), "[::1]:8001");
  EXPECT_EQ(Target({"attnserve", "--host="}), "localhost:8001");
  EXPECT_EQ(Target({"attnserve", "--host=127.0.0.1"}), "127.0.0.1:8001");
  EXPECT_EQ(Target({"attnserve", "--host=::1"}), "[::1]:8001");
  EXPECT_EQ(Target({"attnserve", "--host=[fd00::5]"}), "[fd00::5]:8001");
}

TEST(ServerTargetFromArgsTest, RejectsPortsItCannotReach) {
  for (const char* port : {"0", "-1", "65536", "80a", ""}) {
    const absl::Status status =
        Error({"attnserve", std::string("--grpc_port=") + port});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << port;
    EXPECT_THAT(status.message(), HasSubstr("[1, 65535]")) << port;
  }
  EXPECT_THAT(Error({"attnserve", "--grpc_port"}).message(),
              HasSubstr("no value"));
}

TEST(ServerTargetFromArgsTest, RejectsFlagsSetOutOfSight) {
  for (const char* flag :
       {"--flagfile=/etc/attnserve.flags", "--fromenv=grpc_port",
        "-tryfromenv=grpc_port"}) {
    EXPECT_THAT(Error({"attnserve", flag}).message(), HasSubstr("--target"))
        << flag;
  }
}

TEST(ServerTargetFromArgsTest, RejectsAnEmptyCommandLine) {
  EXPECT_EQ(Error({}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnctl
