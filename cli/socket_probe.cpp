#include "cli/socket_probe.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace muon::cli {

SocketProbe probe_unix_socket(const std::string& path) {
  SocketProbe probe;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    probe.state = SocketProbe::State::other;
    probe.error = "path longer than a Unix socket address allows";
    return probe;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    probe.state = SocketProbe::State::other;
    probe.error = std::strerror(errno);
    return probe;
  }
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  const int err = rc == 0 ? 0 : errno;
  if (rc == 0) {
    probe.state = SocketProbe::State::listening;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
      probe.pid = cred.pid;
    }
  } else if (err == EAGAIN) {  // a listener whose backlog is full: alive, not accepting
    probe.state = SocketProbe::State::listening;
  } else if (err == ENOENT) {
    probe.state = SocketProbe::State::missing;
  } else if (err == ECONNREFUSED) {
    probe.state = SocketProbe::State::refused;
  } else {
    probe.state = SocketProbe::State::other;
    probe.error = std::strerror(err);
  }
  ::close(fd);
  return probe;
}

}  // namespace muon::cli
