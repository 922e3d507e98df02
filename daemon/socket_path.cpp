#include "daemon/socket_path.hpp"

#include <unistd.h>

#include <cstdlib>

namespace muon::daemon {

std::string default_socket_path() {
  if (const char* env = std::getenv("MUON_OFFLOAD_SOCKET"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) {
    return std::string(xdg) + "/muon-offload/muon-offloadd.sock";
  }
  return "/tmp/muon-offload-" + std::to_string(getuid()) + "/muon-offloadd.sock";
}

}  // namespace muon::daemon
