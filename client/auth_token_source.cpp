#include "client/auth_token_source.hpp"

#include <cstdlib>

#include "core/error.hpp"
#include "transport/auth_token.hpp"
#include "transport/endpoint.hpp"

namespace muon::client {

std::string auth_token_for(const std::string& configured,
                           const std::vector<std::string>& endpoints) {
  if (!configured.empty()) {
    // As the token file is read: surrounding whitespace (a newline read along with it) dropped.
    const auto first = configured.find_first_not_of(" \t\r\n");
    const auto last = configured.find_last_not_of(" \t\r\n");
    return first == std::string::npos ? "" : configured.substr(first, last - first + 1);
  }
  const char* file = std::getenv(kTokenFileEnv);
  if (file == nullptr || *file == '\0' || !transport::any_tcp_endpoint(endpoints)) return "";
  try {
    return transport::read_auth_token(file);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(e.message() + " (named by " + kTokenFileEnv + ")");
  }
}

}  // namespace muon::client
