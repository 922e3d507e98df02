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
  bool any_tcp = false;
  for (const auto& e : endpoints) any_tcp = any_tcp || transport::parse_endpoint(e).is_tcp();
  const char* file = std::getenv(kTokenFileEnv);
  if (!any_tcp || file == nullptr || *file == '\0') return "";
  try {
    return transport::read_auth_token(file);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(e.message() + " (named by " + kTokenFileEnv + ")");
  }
}

}  // namespace muon::client
