// A byte pattern both sides of the IPC tests compute independently from a seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace muon::testing {

/// `bytes` bytes that differ per position and per seed (and are never all zero).
inline std::vector<uint8_t> ipc_pattern(size_t bytes, unsigned seed) {
  std::vector<uint8_t> p(bytes);
  uint32_t x = 2654435761u * (seed + 1);
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<uint8_t>(x | 1u);
  }
  return p;
}

}  // namespace muon::testing
