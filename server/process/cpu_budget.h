// How many CPUs this process may really use, for sizing its thread pools.
//
// In a container limited to N CPUs the node's core count is the wrong answer:
// a pool sized to 64 cores under a 2-CPU quota has its threads throttled by
// the kernel's CFS bandwidth control, which shows up as tail latency. The
// budget is the smallest of
// - the CPUs the process may be scheduled on (sched_getaffinity: cpusets,
//   `docker run --cpuset-cpus`, taskset);
// - the cgroup CPU quota, rounded up to whole CPUs: cgroup v2 `cpu.max`
//   ("max 100000" means none), cgroup v1 `cpu.cfs_quota_us` over
//   `cpu.cfs_period_us` (-1 means none), taking the tightest limit on the
//   path from the process's cgroup up to the hierarchy's mount point, as the
//   kernel enforces every level (`docker run --cpus`, Kubernetes limits).
// Thread safety: pure functions over the files they are pointed at.
#ifndef ATTNSERVE_SERVER_PROCESS_CPU_BUDGET_H_
#define ATTNSERVE_SERVER_PROCESS_CPU_BUDGET_H_

#include <optional>
#include <string>

namespace attnserve {

// Where the kernel's view of cgroups is read from. Tests point these at fake
// files; `root` prefixes every mount point found in `mountinfo`.
struct CgroupFiles {
  std::string self_cgroup = "/proc/self/cgroup";
  std::string mountinfo = "/proc/self/mountinfo";
  std::string root;
};

struct CpuQuota {
  double cpus = 0;      // quota / period, e.g. 1.5
  std::string source;   // the file that set it and what it said
};

// The tightest CPU quota on this process's cgroup path, or nullopt when no
// hierarchy limits it (or the files cannot be read: no limit is assumed).
std::optional<CpuQuota> ReadCpuQuota(const CgroupFiles& files);

struct CpuBudget {
  int cpus = 1;         // at least 1
  std::string reason;   // for the start-up log
};

// min(affinity CPUs, ceil(quota)), both as read above; `affinity_cpus` <= 0
// means unknown (then std::thread::hardware_concurrency()).
CpuBudget DecideCpuBudget(int affinity_cpus,
                          const std::optional<CpuQuota>& quota);

// The budget of this process: sched_getaffinity and the real cgroup files.
CpuBudget DetectCpuBudget();

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_PROCESS_CPU_BUDGET_H_
