#include "daemon/socket_security.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace muon::daemon {

namespace {

bool socket_is_alive(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool alive = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return alive;
}

}  // namespace

void prepare_socket_path(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    throw Error("socket path '" + path + "' is longer than " +
                std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) throw Error("cannot create socket directory '" + dir.string() + "': " + ec.message());
      ::chmod(dir.c_str(), 0700);
      if (::stat(dir.c_str(), &st) != 0) throw Error("cannot stat '" + dir.string() + "'");
    }
    if (!S_ISDIR(st.st_mode)) throw Error("'" + dir.string() + "' is not a directory");
    if (st.st_uid != ::getuid()) {
      throw Error("socket directory '" + dir.string() + "' belongs to uid " +
                  std::to_string(st.st_uid) + ", not to this user");
    }
    // A shared folder (/tmp itself) is fine only when sticky; a private one must not be writable
    // by others.
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
      throw Error("socket directory '" + dir.string() +
                  "' is writable by group or others; use a private directory (mode 0700)");
    }
  }
  struct stat sst {};
  if (::lstat(path.c_str(), &sst) == 0) {
    if (!S_ISSOCK(sst.st_mode)) throw Error("'" + path + "' exists and is not a socket");
    if (socket_is_alive(path)) {
      throw Error("another server is already listening on '" + path + "'");
    }
    ::unlink(path.c_str());  // stale socket of a server that died
  }
}

PeerCredentials peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    throw Error(std::string("getsockopt(SO_PEERCRED) failed: ") + std::strerror(errno));
  }
  return {cred.pid, cred.uid, cred.gid};
}

}  // namespace muon::daemon
