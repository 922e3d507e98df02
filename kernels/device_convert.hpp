// Element conversions the server's GPU data plane needs on device buffers, enqueued on a stream:
// filling a sum's start value and narrowing fp32 updates to bf16 with the host's rounding
// (kernels/bf16.hpp: round to nearest even, NaN kept quiet), so a bf16 update is bitwise the
// same whether the host or the device narrowed it. The header names no CUDA type.
#pragma once

#include <cstdint>

#include "kernels/device_stream.hpp"

namespace muon {

/// out[i] = value, i in [0, n): device fp32. Returns without waiting. Throws InvalidArgument for
/// a negative n or a null pointer with n > 0, DeviceError when the launch fails.
void fill_device(float* out, int64_t n, float value, StreamHandle stream);

/// out[i] = bf16(in[i]) (bf16_bits_from_f32_bits), i in [0, n): device memory, not
/// overlapping. Returns without waiting. Throws as fill_device.
void narrow_to_bf16_device(const float* in, uint16_t* out, int64_t n, StreamHandle stream);

}  // namespace muon
