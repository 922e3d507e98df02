// The input format of the frame harness (fuzz_frame.cpp), shared with the seed writer:
//
//   byte 0      split seed: how the stream is cut into feed() calls (split_sizes)
//   bytes 1..   the byte stream a peer sends (frames, or anything else)
//
// A seed is therefore one byte followed by encode_frame() output; libFuzzer mutates both the
// stream and the way it arrives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace muon::fuzz {

/// Lengths (each >= 1, summing to `total`) of the pieces a stream of `total` bytes is fed in.
/// Seed 0 feeds the stream whole; other seeds cut it into pieces of 1..(seed % 32 + 1) bytes
/// drawn from a xorshift generator, so every cut point is reachable.
inline std::vector<size_t> split_sizes(uint8_t seed, size_t total) {
  std::vector<size_t> out;
  if (seed == 0) {
    if (total > 0) out.push_back(total);
    return out;
  }
  const uint32_t max_piece = seed % 32u + 1u;
  uint32_t state = 0x9E3779B9u ^ seed;
  for (size_t pos = 0; pos < total;) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    const size_t n = std::min<size_t>(total - pos, 1 + state % max_piece);
    out.push_back(n);
    pos += n;
  }
  return out;
}

/// A frame-harness input: the split seed followed by `stream`.
inline std::vector<uint8_t> frame_input(uint8_t split_seed, const std::vector<std::byte>& stream) {
  std::vector<uint8_t> out;
  out.reserve(stream.size() + 1);
  out.push_back(split_seed);
  for (auto b : stream) out.push_back(std::to_integer<uint8_t>(b));
  return out;
}

}  // namespace muon::fuzz
