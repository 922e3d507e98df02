// Error codes: one enum for every failure a caller may have to tell apart. The integers are
// stable: they travel on the wire (with the name, transport::ErrorMsg), through the C ABI
// (muon_last_error_code, client/muon_client.h) and into Python's exception types.
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace muon {

/// Why a request failed. A new code takes the next free integer; a used one is never renumbered
/// or reused. "S" codes are sent by the server (muon-offloadd), "C" codes raised by the client
/// library itself; a few (peer_lost, timeout) come from both.
enum class ErrorCode : int {
  none = 0,            ///< no error
  bad_request = 1,     ///< S: a request the server refuses (shape, range, unknown parameter, ...)
  protocol = 2,        ///< S: a frame or payload that does not parse
  unsupported = 3,     ///< S: a data plane or feature this server cannot serve
  unauthorized = 4,    ///< S: a TCP hello without the server's token
  peer_lost = 5,       ///< S/C: another rank, a relay's owner, or the connection was lost
  timeout = 6,         ///< S/C: a wait ran past its deadline (a rank never committed, ...)
  non_finite = 7,      ///< S: NaN/Inf in a gradient under the non-finite policy "error"
  backend = 8,         ///< S: Newton-Schulz failed on the server's backend
  data_plane = 9,      ///< S: the session's data plane failed (a copy into a result slot, ...)
  nccl = 10,           ///< S: joining the session's NCCL communicators failed
  snapshot = 11,       ///< S: a snapshot could not be written or read
  shutdown = 12,       ///< S: the server is shutting down
  server = 13,         ///< S: an internal error of the server
  step_mismatch = 14,  ///< S: a step that does not follow the parameter's last applied step
                       ///<    (a step gap, or a step already applied)
  bad_reply = 15,      ///< C: an answer of the server the client cannot use
  connection_lost = 16,   ///< C: the server is unreachable, or the connection was lost
  invalid_argument = 17,  ///< C: a bad argument (shape, name, range, option)
  device = 18,            ///< C: a CUDA or NCCL call failed
  unavailable = 19,       ///< C: not available in this build (no CUDA, no NCCL)
  internal = 20,          ///< C: anything else
};

namespace detail {
inline constexpr std::array<std::string_view, 21> kErrorCodeNames = {
    "none",          "bad_request", "protocol", "unsupported",     "unauthorized",
    "peer_lost",     "timeout",     "non_finite", "backend",       "data_plane",
    "nccl",          "snapshot",    "shutdown", "server",          "step_mismatch",
    "bad_reply",     "connection_lost", "invalid_argument", "device", "unavailable",
    "internal"};
}  // namespace detail

/// Every code, in integer order (for tables, tests and the Python mapping).
inline constexpr int kErrorCodeCount = static_cast<int>(detail::kErrorCodeNames.size());

/// The code's name as on the wire ("peer_lost"); "internal" for an integer outside the enum.
constexpr std::string_view error_code_name(ErrorCode code) {
  const int i = static_cast<int>(code);
  return i >= 0 && i < kErrorCodeCount ? detail::kErrorCodeNames[static_cast<size_t>(i)]
                                       : std::string_view("internal");
}

/// The code named `name`, or nullopt for a name this build does not know.
constexpr std::optional<ErrorCode> error_code_from_name(std::string_view name) {
  for (int i = 0; i < kErrorCodeCount; ++i) {
    if (detail::kErrorCodeNames[static_cast<size_t>(i)] == name) return static_cast<ErrorCode>(i);
  }
  return std::nullopt;
}

/// The code with integer `value`, or nullopt outside the enum.
constexpr std::optional<ErrorCode> error_code_from_int(int value) {
  if (value < 0 || value >= kErrorCodeCount) return std::nullopt;
  return static_cast<ErrorCode>(value);
}

}  // namespace muon
