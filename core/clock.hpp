// The monotonic clock every latency and deadline of the project is measured on.
#pragma once

#include <chrono>

namespace muon {

using Clock = std::chrono::steady_clock;

/// Seconds elapsed on Clock since `start` (fractional, >= 0 for a `start` in the past).
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace muon
