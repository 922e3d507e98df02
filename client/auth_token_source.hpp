// Where a client's TCP token comes from: ClientConfig::auth_token, else the file named by the
// environment variable MUON_OFFLOAD_TOKEN_FILE (the same file as the server's --auth-token-file).
#pragma once

#include <string>
#include <vector>

namespace muon::client {

/// Environment variable naming the token file (mode 0600) when the config gives no token.
inline constexpr const char* kTokenFileEnv = "MUON_OFFLOAD_TOKEN_FILE";

/// The token to say hello with on tcp endpoints: `configured` when not empty; else, when one of
/// `endpoints` is "tcp://..." and MUON_OFFLOAD_TOKEN_FILE is set, the file's token
/// (transport::read_auth_token); else "" (a tcp server then refuses the hello: "unauthorized").
/// The file is not read for Unix sockets only. Throws InvalidArgument naming the file and the
/// variable when it cannot be read, is open to group or others, or holds no valid token.
std::string auth_token_for(const std::string& configured,
                           const std::vector<std::string>& endpoints);

}  // namespace muon::client
