// Where muon-offloadd listens when no --socket is given; shared by the server and the CLI.
#pragma once

#include <string>

namespace muon::daemon {

/// $MUON_OFFLOAD_SOCKET when set; else $XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock; else
/// /tmp/muon-offload-<uid>/muon-offloadd.sock.
std::string default_socket_path();

}  // namespace muon::daemon
