#include "kernels/bf16.hpp"

namespace muon {

void widen_to_f32(DType dtype, const void* src, std::span<float> dst) {
  if (dst.empty()) return;
  if (dtype == DType::f32) {
    std::memcpy(dst.data(), src, dst.size() * sizeof(float));
    return;
  }
  const auto* bytes = static_cast<const std::byte*>(src);
  for (size_t i = 0; i < dst.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    dst[i] = bf16_to_f32(h);
  }
}

void narrow_from_f32(DType dtype, std::span<const float> src, void* dst) {
  if (src.empty()) return;
  if (dtype == DType::f32) {
    std::memcpy(dst, src.data(), src.size() * sizeof(float));
    return;
  }
  auto* bytes = static_cast<std::byte*>(dst);
  for (size_t i = 0; i < src.size(); ++i) {
    const uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(bytes + 2 * i, &h, 2);
  }
}

}  // namespace muon
