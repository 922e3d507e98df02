// bfloat16 <-> float32 for the data plane: bf16 is the upper 16 bits of an IEEE float32.
// float -> bf16 rounds to nearest even (as torch's .to(torch.bfloat16)); NaN stays a quiet NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace muon::transport {

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace muon::transport
