#include "transport/hex_bytes.hpp"

#include "core/error.hpp"

namespace muon::transport {
namespace {

constexpr char kDigits[] = "0123456789abcdef";

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string to_hex(std::span<const uint8_t> bytes) {
  std::string out;
  out.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

void from_hex(std::string_view text, std::span<uint8_t> out, std::string_view what) {
  if (text.size() != 2 * out.size()) {
    throw InvalidArgument(std::string(what) + ": expected " + std::to_string(2 * out.size()) +
                          " hex digits (" + std::to_string(out.size()) + " bytes), got " +
                          std::to_string(text.size()) + " characters");
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (digit_value(text[i]) < 0) {
      throw InvalidArgument(std::string(what) + ": character " + std::to_string(i) +
                            " is not a hex digit");
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(digit_value(text[2 * i]) * 16 + digit_value(text[2 * i + 1]));
  }
}

}  // namespace muon::transport
