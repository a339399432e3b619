// CPU budget from fake cgroup trees: v2 and v1, limits at the process's own
// level and above it, no limit, a quota wider than the affinity mask, and a
// container whose mount root is its own cgroup.
#include "server/process/cpu_budget.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;

class FakeCgroups : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/cpu_budget_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    files_.self_cgroup = root_ + "/self_cgroup";
    files_.mountinfo = root_ + "/mountinfo";
    files_.root = root_;
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& path, const std::string& text) {
    const fs::path full = fs::path(root_) / fs::path(path).relative_path();
    fs::create_directories(full.parent_path());
    std::ofstream(full) << text;
  }

  std::string root_;
  CgroupFiles files_;
};

TEST_F(FakeCgroups, V2QuotaAtTheProcessLevelRoundsUp) {
  Write("mountinfo",
        "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n");
  Write("self_cgroup", "0::/kubepods/pod1/ctr\n");
  Write("sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "150000 100000\n");
  const auto quota = ReadCpuQuota(files_);
  ASSERT_TRUE(quota.has_value());
  EXPECT_DOUBLE_EQ(quota->cpus, 1.5);
  EXPECT_NE(quota->source.find("kubepods/pod1/ctr/cpu.max"), std::string::npos);
  const CpuBudget budget = DecideCpuBudget(16, quota);
  EXPECT_EQ(budget.cpus, 2);
  EXPECT_NE(budget.reason.find("cgroup CPU quota of 1.5"), std::string::npos)
      << budget.reason;
}

TEST_F(FakeCgroups, V2TightestLevelOnThePathWins) {
  Write("mountinfo",
        "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n");
  Write("self_cgroup", "0::/a/b\n");
  Write("sys/fs/cgroup/cpu.max", "max 100000\n");
  Write("sys/fs/cgroup/a/cpu.max", "100000 100000\n");
  Write("sys/fs/cgroup/a/b/cpu.max", "max 100000\n");
  const auto quota = ReadCpuQuota(files_);
  ASSERT_TRUE(quota.has_value());
  EXPECT_DOUBLE_EQ(quota->cpus, 1.0);
  EXPECT_EQ(DecideCpuBudget(8, quota).cpus, 1);
}

TEST_F(FakeCgroups, V2NoLimitLeavesTheAffinity) {
  Write("mountinfo",
        "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n");
  Write("self_cgroup", "0::/\n");
  Write("sys/fs/cgroup/cpu.max", "max 100000\n");
  EXPECT_FALSE(ReadCpuQuota(files_).has_value());
  const CpuBudget budget = DecideCpuBudget(6, std::nullopt);
  EXPECT_EQ(budget.cpus, 6);
  EXPECT_NE(budget.reason.find("6 CPUs this process may run on"),
            std::string::npos);
}

TEST_F(FakeCgroups, V1CpuControllerWithCfsQuota) {
  // A v1 machine as these CI machines are: cpu and cpuacct mounted apart,
  // plus an unrelated memory hierarchy and a cgroup2 one with no limit.
  Write("mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  Write("self_cgroup", "4:memory:/job\n1:cpu:/job\n0::/\n");
  Write("sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "50000\n");
  Write("sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "100000\n");
  Write("sys/fs/cgroup/memory/job/cpu.cfs_quota_us", "1000\n");  // ignored
  const auto quota = ReadCpuQuota(files_);
  ASSERT_TRUE(quota.has_value());
  EXPECT_DOUBLE_EQ(quota->cpus, 0.5);
  EXPECT_EQ(DecideCpuBudget(2, quota).cpus, 1);
}

TEST_F(FakeCgroups, V1UnlimitedIsMinusOne) {
  Write("mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n");
  Write("self_cgroup", "2:cpu,cpuacct:/\n");
  Write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_FALSE(ReadCpuQuota(files_).has_value());
}

// Without a cgroup namespace the container sees the host's path in
// /proc/self/cgroup, and its mount's root is that same path.
TEST_F(FakeCgroups, ContainerMountRootIsItsOwnCgroup) {
  Write("mountinfo",
        "50 40 0:29 /docker/abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n");
  Write("self_cgroup", "3:cpu:/docker/abc\n");
  Write("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "300000\n");
  Write("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  const auto quota = ReadCpuQuota(files_);
  ASSERT_TRUE(quota.has_value());
  EXPECT_DOUBLE_EQ(quota->cpus, 3.0);
}

TEST_F(FakeCgroups, QuotaWiderThanTheAffinityDoesNotBind) {
  const CpuBudget budget = DecideCpuBudget(2, CpuQuota{4.0, "cpu.max"});
  EXPECT_EQ(budget.cpus, 2);
  EXPECT_NE(budget.reason.find("does not bind"), std::string::npos);
}

TEST_F(FakeCgroups, UnreadableFilesMeanNoLimit) {
  EXPECT_FALSE(ReadCpuQuota(files_).has_value());  // nothing written
  EXPECT_GE(DetectCpuBudget().cpus, 1);             // the real machine
}

}  // namespace
}  // namespace attnserve
