// Element types of gradient, update and contribution bytes: one enum for the wire, the data
// planes and the reduction kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace muon {

/// An element type of data-plane bytes: IEEE float32, or bfloat16 (the upper 16 bits of a
/// float32, kernels/bf16.hpp). Momentum is always f32.
enum class DType : uint8_t { f32, bf16 };

/// Bytes per element: 4 (f32) or 2 (bf16).
constexpr size_t dtype_bytes(DType d) {
  return d == DType::f32 ? 4 : 2;
}

/// "f32" or "bf16" (the wire's names).
constexpr const char* dtype_name(DType d) {
  return d == DType::f32 ? "f32" : "bf16";
}

/// "f32" | "fp32" | "float32" -> f32, "bf16" | "bfloat16" -> bf16; throws InvalidArgument
/// listing the names otherwise.
inline DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  throw InvalidArgument("unknown dtype '" + std::string(name) + "' (known: f32, bf16)");
}

}  // namespace muon
