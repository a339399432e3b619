#include "server/process/cpu_budget.h"

#include <sched.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace attnserve {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// One cgroup hierarchy that can limit CPU time, as mounted.
struct Hierarchy {
  bool v2 = false;
  std::string mount_root;   // the cgroup path shown at the mount point
  std::string mount_point;  // where it is mounted (with CgroupFiles::root)
};

// cgroup v1 hierarchies with the cpu controller, and the cgroup2 one.
std::vector<Hierarchy> CpuHierarchies(const CgroupFiles& files) {
  std::vector<Hierarchy> found;
  const std::optional<std::string> mountinfo = ReadFile(files.mountinfo);
  if (!mountinfo) return found;
  for (absl::string_view line : absl::StrSplit(*mountinfo, '\n')) {
    // "36 25 0:31 / /sys/fs/cgroup/cpu rw,... - cgroup cgroup rw,cpu,cpuacct"
    const std::vector<absl::string_view> halves =
        absl::StrSplit(line, absl::MaxSplits(" - ", 1));
    if (halves.size() != 2) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(halves[0], ' ', absl::SkipEmpty());
    const std::vector<absl::string_view> tail =
        absl::StrSplit(halves[1], ' ', absl::SkipEmpty());
    if (fields.size() < 5 || tail.empty()) continue;
    Hierarchy hierarchy;
    hierarchy.mount_root = std::string(fields[3]);
    hierarchy.mount_point = absl::StrCat(files.root, fields[4]);
    if (tail[0] == "cgroup2") {
      hierarchy.v2 = true;
    } else if (tail[0] == "cgroup" && tail.size() >= 3) {
      bool has_cpu = false;
      for (absl::string_view option : absl::StrSplit(tail[2], ',')) {
        has_cpu = has_cpu || option == "cpu";
      }
      if (!has_cpu) continue;
    } else {
      continue;
    }
    found.push_back(hierarchy);
  }
  return found;
}

// The process's path in the v2 hierarchy ("0::/path") or the v1 one with
// the cpu controller ("4:cpu,cpuacct:/path").
std::optional<std::string> CgroupPath(const CgroupFiles& files, bool v2) {
  const std::optional<std::string> self = ReadFile(files.self_cgroup);
  if (!self) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*self, '\n')) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (v2 && parts[0] == "0" && parts[1].empty()) return std::string(parts[2]);
    if (!v2) {
      for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
        if (controller == "cpu") return std::string(parts[2]);
      }
    }
  }
  return std::nullopt;
}

// The limit one directory sets, if any.
std::optional<CpuQuota> QuotaIn(const std::string& dir, bool v2) {
  if (v2) {
    const std::string path = dir + "/cpu.max";
    const std::optional<std::string> text = ReadFile(path);
    if (!text) return std::nullopt;
    const std::vector<absl::string_view> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    double quota = 0, period = 0;
    if (parts.size() != 2 || parts[0] == "max" ||
        !absl::SimpleAtod(parts[0], &quota) ||
        !absl::SimpleAtod(parts[1], &period) || quota <= 0 || period <= 0) {
      return std::nullopt;
    }
    return CpuQuota{quota / period,
                    absl::StrCat(path, " = \"", parts[0], " ", parts[1], "\"")};
  }
  const std::optional<std::string> quota_text = ReadFile(dir + "/cpu.cfs_quota_us");
  const std::optional<std::string> period_text =
      ReadFile(dir + "/cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (!quota_text || !period_text ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(*quota_text), &quota) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(*period_text), &period) ||
      quota <= 0 || period <= 0) {
    return std::nullopt;  // -1: no limit
  }
  return CpuQuota{quota / period,
                  absl::StrCat(dir, "/cpu.cfs_quota_us = ", quota, " over ",
                               "cpu.cfs_period_us = ", period)};
}

}  // namespace

std::optional<CpuQuota> ReadCpuQuota(const CgroupFiles& files) {
  std::optional<CpuQuota> tightest;
  for (const Hierarchy& hierarchy : CpuHierarchies(files)) {
    std::optional<std::string> path = CgroupPath(files, hierarchy.v2);
    if (!path) continue;
    // The process's directory under the mount point. Inside a container the
    // mount's root is the container's own cgroup (often "/"), and the path
    // in /proc/self/cgroup is relative to it or (cgroup namespaces off) the
    // host's full path, which then starts with the mount root.
    absl::string_view relative = *path;
    if (hierarchy.mount_root != "/" &&
        !absl::ConsumePrefix(&relative, hierarchy.mount_root)) {
      relative = "/";
    }
    std::string dir = hierarchy.mount_point;
    if (relative != "/") absl::StrAppend(&dir, relative);
    // Every level from the process's directory up to the mount point.
    while (true) {
      std::optional<CpuQuota> quota = QuotaIn(dir, hierarchy.v2);
      if (quota && (!tightest || quota->cpus < tightest->cpus)) tightest = quota;
      if (dir.size() <= hierarchy.mount_point.size()) break;
      dir.erase(dir.rfind('/'));
    }
  }
  return tightest;
}

CpuBudget DecideCpuBudget(int affinity_cpus,
                          const std::optional<CpuQuota>& quota) {
  CpuBudget budget;
  if (affinity_cpus <= 0) {
    affinity_cpus = static_cast<int>(std::thread::hardware_concurrency());
  }
  budget.cpus = std::max(1, affinity_cpus);
  budget.reason = absl::StrCat(budget.cpus, " CPUs this process may run on");
  if (quota) {
    const int quota_cpus =
        std::max(1, static_cast<int>(std::ceil(quota->cpus - 1e-9)));
    if (quota_cpus < budget.cpus) {
      budget.cpus = quota_cpus;
      budget.reason = absl::StrCat("cgroup CPU quota of ", quota->cpus,
                                   " CPUs (", quota->source, "), rounded up");
    } else {
      absl::StrAppend(&budget.reason, "; the cgroup CPU quota (", quota->cpus,
                      ") does not bind");
    }
  }
  return budget;
}

CpuBudget DetectCpuBudget() {
  cpu_set_t set;
  int affinity = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = CPU_COUNT(&set);
  return DecideCpuBudget(affinity, ReadCpuQuota(CgroupFiles{}));
}

}  // namespace attnserve
