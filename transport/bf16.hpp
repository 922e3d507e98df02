// Forwarding header: the bf16 conversions live in kernels/bf16.hpp (namespace muon). Kept only
// while daemon/engine.cpp still includes this path (its split is under way); new code includes
// kernels/bf16.hpp.
#pragma once

#include "kernels/bf16.hpp"

namespace muon::transport {
using muon::bf16_bits_from_f32_bits;
using muon::bf16_to_f32;
using muon::f32_to_bf16;
}  // namespace muon::transport
