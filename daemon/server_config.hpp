// Start-up settings of muon-offloadd (flags in daemon/main.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "daemon/socket_path.hpp"
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
  /// TCP port of the Prometheus endpoint (GET /metrics); 0: no endpoint.
  uint16_t metrics_port = 0;
  /// Address the metrics endpoint binds to (loopback by default: the metrics name parameters).
  std::string metrics_address = "127.0.0.1";
  /// Numeric health: measure every Nth update of each parameter (the 1st, N+1th, ...); 0: off.
  int64_t health_sample_every = 0;
  /// Warn when a sampled orthogonality error exceeds this; unset: per schedule, the largest
  /// |s^2 - 1| over the singular-value band the schedule promises (daemon/numeric_health.hpp).
  std::optional<double> health_warn_threshold;
};

}  // namespace muon::daemon
