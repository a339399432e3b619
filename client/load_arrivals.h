// The arrival times of `attnctl load`'s open loop: a seeded Poisson process,
// so that a run's schedule is reproducible and independent of how fast the
// server answers.
#ifndef ATTNSERVE_CLIENT_LOAD_ARRIVALS_H_
#define ATTNSERVE_CLIENT_LOAD_ARRIVALS_H_

#include <cstdint>
#include <random>

namespace attnctl {

// The inter-arrival times of a Poisson process: exponential with mean
// 1/rate. Deterministic for a seed. Thread-compatible; never blocks.
class PoissonArrivals {
 public:
  // rate_per_second > 0.
  PoissonArrivals(double rate_per_second, uint64_t seed);

  // The time to the next arrival, in nanoseconds (>= 0).
  int64_t NextNanos();

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> seconds_;
};

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_ARRIVALS_H_
