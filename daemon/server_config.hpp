// Start-up settings of muon-offloadd (flags in daemon/main.cpp).
#pragma once

#include <chrono>
#include <string>

#include "transport/shm_segment.hpp"

namespace muon::daemon {

struct ServerConfig {
  /// Unix socket path; empty: default_socket_path().
  std::string socket_path;
  /// "cpu", "cuda" or "auto".
  std::string backend = "cpu";
  /// OpenBLAS threads for the CPU backend (0: OpenBLAS' own setting).
  int cpu_threads = 0;
  /// Shared-memory rings of each session.
  transport::SegmentLayout layout;
  /// A step must be committed by every contributor within this time after its first chunk;
  /// otherwise the partial step is dropped and every rank of the parameter gets an error naming
  /// the missing ranks.
  std::chrono::milliseconds step_timeout{30000};
  /// Snapshot file written on request and at shutdown; empty: none at shutdown, and requests
  /// must name a path.
  std::string snapshot_path;
  /// Snapshot to restore momentum from at start-up; empty: start fresh.
  std::string restore_path;
  /// Accept clients of another uid (default: only the server's own uid may connect).
  bool allow_other_users = false;
};

/// $XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock, or /tmp/muon-offload-<uid>/... when
/// XDG_RUNTIME_DIR is unset. Environment variable MUON_OFFLOAD_SOCKET overrides both.
std::string default_socket_path();

}  // namespace muon::daemon
