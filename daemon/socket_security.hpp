// Who may talk to the server: the socket lives in a private directory (mode 0700, owned by the
// server's uid), the socket file itself is mode 0600, and every accepted connection's peer
// credentials (SO_PEERCRED) are checked against the server's uid.
#pragma once

#include <sys/types.h>
#include <string>

namespace muon::daemon {

/// Creates the socket's parent directory with mode 0700 if missing; refuses (muon::Error) a
/// directory owned by another user or writable by group/others, and a live socket at `path`
/// (another server runs). Removes a stale socket file.
void prepare_socket_path(const std::string& path);

/// Peer credentials of a connected Unix socket.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

/// Reads SO_PEERCRED. Throws muon::Error on failure.
PeerCredentials peer_credentials(int fd);

}  // namespace muon::daemon
