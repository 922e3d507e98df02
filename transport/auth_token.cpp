#include "transport/auth_token.hpp"

#include <sys/stat.h>

#include <fstream>

#include "core/error.hpp"

namespace muon::transport {

std::string read_auth_token(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InvalidArgument("auth token file '" + path + "' cannot be read");
  }
  if ((st.st_mode & 077) != 0) {
    throw InvalidArgument("auth token file '" + path +
                          "' is accessible to group or others; chmod 600 it");
  }
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) {
    throw InvalidArgument("auth token file '" + path + "' cannot be read or is empty");
  }
  const auto first = line.find_first_not_of(" \t\r\n");
  const auto last = line.find_last_not_of(" \t\r\n");
  const std::string token = first == std::string::npos ? "" : line.substr(first, last - first + 1);
  if (token.size() < kMinTokenBytes || token.size() > 256) {
    throw InvalidArgument("auth token in '" + path + "' must be " + std::to_string(kMinTokenBytes) +
                          " to 256 bytes, it has " + std::to_string(token.size()));
  }
  return token;
}

bool tokens_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace muon::transport
