// bfloat16 <-> float32: bf16 is the upper 16 bits of an IEEE float32. float -> bf16 rounds to
// nearest even (as torch's .to(torch.bfloat16)); NaN stays a quiet NaN. bf16 -> float is exact.
// The span versions are the one home of the conversion loops (wire, relays, reductions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "kernels/dtype.hpp"
#include "kernels/elementwise.hpp"  // MUON_HD

namespace muon {

/// The bf16 bits of the float with bits `u`, rounded to nearest even; NaN -> quiet NaN. Shared by
/// the host (f32_to_bf16) and the server's device narrowing (kernels/device_convert.cu).
MUON_HD uint16_t bf16_bits_from_f32_bits(uint32_t u) {
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return bf16_bits_from_f32_bits(u);
}

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// dst[i] = float(src[i]) for `dst.size()` elements of `dtype` at `src` (any alignment: the
/// bytes of a ring slot or a socket buffer). f32 is copied; bf16 widened exactly.
void widen_to_f32(DType dtype, const void* src, std::span<float> dst);

/// The `src.size()` floats written to `dst` as `dtype` (any alignment): f32 copied, bf16
/// rounded to nearest even (f32_to_bf16).
void narrow_from_f32(DType dtype, std::span<const float> src, void* dst);

}  // namespace muon
