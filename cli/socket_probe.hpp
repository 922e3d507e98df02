// Who holds a Unix socket: whether a process listens on it (and its pid, from the peer
// credentials the kernel records at listen()), without speaking the protocol. What tells a hung
// server (it listens, but does not answer) from a dead one (a socket file nobody listens on).
#pragma once

#include <string>

namespace muon::cli {

/// What a connect() to a Unix socket path found.
struct SocketProbe {
  enum class State {
    missing,    ///< no file at the path
    refused,    ///< a socket file, but nobody listens (a server that died without unlinking it)
    listening,  ///< a process listens (connect succeeded, or its backlog is full)
    other,      ///< not a socket, no permission, or another error (`error` says which)
  };
  State state = State::missing;
  int pid = -1;       ///< the listening process (SO_PEERCRED), -1 when unknown
  std::string error;  ///< strerror of the failure, for `other`
};

/// Connects to `path` once (non-blocking; no byte is sent) and closes the connection.
SocketProbe probe_unix_socket(const std::string& path);

}  // namespace muon::cli
