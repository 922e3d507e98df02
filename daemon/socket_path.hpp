// Where muon-offloadd listens when no --socket is given; shared by the server, the CLI and the
// client library (muon_default_socket_path, the Python client's fallback).
#pragma once

#include <string>

namespace muon::daemon {

/// $MUON_OFFLOAD_SOCKET when set; else $XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock; else
/// /tmp/muon-offload-<uid>/muon-offloadd.sock.
std::string default_socket_path();

}  // namespace muon::daemon
