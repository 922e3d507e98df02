// Fixed-size binary handles (CUDA IPC handles, NCCL unique ids) as text for the control plane:
// lowercase hexadecimal, two digits per byte, nothing else.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace muon::transport {

/// "0a1bff..." for `bytes`: 2 * bytes.size() lowercase hex digits.
std::string to_hex(std::span<const uint8_t> bytes);

/// Decodes `text` into exactly `out.size()` bytes. Accepts upper- and lowercase digits.
/// Throws InvalidArgument naming `what` when the length is not 2 * out.size() or a character is
/// not a hex digit (with its position); `out` is then left unspecified.
void from_hex(std::string_view text, std::span<uint8_t> out, std::string_view what);

/// from_hex into a new array of N bytes.
template <size_t N>
std::array<uint8_t, N> from_hex(std::string_view text, std::string_view what) {
  std::array<uint8_t, N> out{};
  from_hex(text, std::span<uint8_t>(out), what);
  return out;
}

}  // namespace muon::transport
