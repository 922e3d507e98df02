// The shared secret of TCP control connections. On a Unix socket the server checks the peer's
// uid (SO_PEERCRED); a TCP peer has none, so a client on another node proves itself with a token
// the operator placed in a file on both nodes (muon-offloadd --auth-token-file, the client's
// MUON_OFFLOAD_TOKEN_FILE), sent in its hello.
#pragma once

#include <string>
#include <string_view>

namespace muon::transport {

/// Shortest token accepted (bytes).
inline constexpr size_t kMinTokenBytes = 16;

/// The token in `path`: its first line, surrounding whitespace dropped. Throws InvalidArgument
/// naming the file when it cannot be read, is readable or writable by group or others (mode &
/// 077), or the token is shorter than kMinTokenBytes or longer than 256 bytes.
std::string read_auth_token(const std::string& path);

/// Compares in time independent of where the strings differ (lengths are not secret).
bool tokens_equal(std::string_view a, std::string_view b);

}  // namespace muon::transport
