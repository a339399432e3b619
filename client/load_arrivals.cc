#include "client/load_arrivals.h"

#include <cmath>

namespace attnctl {

PoissonArrivals::PoissonArrivals(double rate_per_second, uint64_t seed)
    : rng_(seed), seconds_(rate_per_second) {}

int64_t PoissonArrivals::NextNanos() {
  return std::llround(seconds_(rng_) * 1e9);
}

}  // namespace attnctl
