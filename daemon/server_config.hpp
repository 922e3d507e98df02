// Start-up settings of muon-offloadd (flags in daemon/main.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  /// CUDA device ordinal of the CUDA backend and the GPU data plane (after CUDA_VISIBLE_DEVICES).
  int cuda_device = 0;
  /// On the CUDA backend: keep gradients, momentum and updates in host memory and call the CUDA
  /// backend's host API per step (no GPU data plane, no cuda_ipc sessions). Default: the GPU
  /// data plane (daemon/device_plane.hpp).
  bool host_staging = false;
  /// Host memory only: each copy to the host completes through the Engine's CompletionQueue, a
  /// poll later, as the GPU data plane's do (daemon/step/param_storage.hpp), instead of at once.
  /// For tests: the CPU path then runs the GPU path's continuations (--defer-host-copies).
  bool defer_host_copies = false;
  /// Priority of the GPU data plane's streams: "normal", "low" (a server sharing its GPU with a
  /// compute rank) or "high" (kernels/device_stream.hpp).
  std::string stream_priority = "normal";
  /// Capture each shape's Newton-Schulz sequence as a CUDA graph once, then replay it.
  bool cuda_graphs = false;
  /// Shared-memory rings of each session.
  transport::SegmentLayout layout;
  /// A step must be committed by every contributor within this time after its first chunk;
  /// otherwise the partial step is dropped and every rank of the parameter gets an error naming
  /// the missing ranks.
  std::chrono::milliseconds step_timeout{30000};
  /// Snapshot file written on request and at shutdown; empty: none at shutdown, and requests
  /// must name a path.
  std::string snapshot_path;
  /// Also write snapshot_path every this many steps (after each step S with (S + 1) % N == 0,
  /// once every owned parameter has applied S: one step for all), on the snapshot writer
  /// thread; 0: never. A crash then loses at most the steps since the last one on disk.
  int64_t snapshot_every = 0;
  /// Snapshot to restore momentum from at start-up; empty: start fresh.
  std::string restore_path;
  /// Accept clients of another uid (default: only the server's own uid may connect).
  bool allow_other_users = false;
  /// TCP control plane for clients on other nodes, "HOST:PORT" (e.g. "0.0.0.0:29600"); empty:
  /// none. Needs auth_token_file: a TCP peer has no uid to check.
  std::string listen;
  /// File holding the shared secret TCP clients send in their hello (first line, surrounding
  /// whitespace dropped, at least 16 bytes); it must not be readable by group or others.
  std::string auth_token_file;
  /// The token read from auth_token_file (the Server fills it in).
  std::string auth_token;
  /// TCP port of the Prometheus endpoint (GET /metrics); 0: no endpoint.
  uint16_t metrics_port = 0;
  /// Address the metrics endpoint binds to (loopback by default: the metrics name parameters).
  std::string metrics_address = "127.0.0.1";
  /// The job's plan (`muon-offload plan` JSON) and this server's id in it: parameters the plan
  /// names are registered by the ranks it routes here (daemon/pool_routes.hpp), and those this
  /// server relays for its domain are forwarded to their owner (daemon/pool/relay.hpp). Empty: every
  /// rank registers every parameter it pushes here, and nothing is relayed.
  std::string plan_path;
  int server_id = -1;
  /// Endpoints of every server of the plan in id order (Unix socket paths, tcp://HOST:PORT):
  /// where a relay finds the owners. Needed when the plan has this server relay parameters.
  std::vector<std::string> pool_servers;
  /// Replicate each owned parameter's state to its owner's buddy (plan servers[].buddy) after
  /// every step, releasing the update once the buddy holds it, so the buddy can take over
  /// when this server is lost (daemon/pool/replicator.hpp). Off: no buddy; a crash loses the steps
  /// since the last snapshot.
  bool replicate = true;
  /// Numeric health: measure every Nth update of each parameter (the 1st, N+1th, ...); 0: off.
  int64_t health_sample_every = 0;
  /// Warn when a sampled orthogonality error exceeds this; unset: per sample, the error the
  /// schedule gives that update's own input plus a rounding allowance (daemon/numeric_health.hpp).
  std::optional<double> health_warn_threshold;
  /// Forget the parameters (momentum, last step) of a job once no session of it has been
  /// connected for this long: a long-lived server otherwise keeps every finished job's momentum
  /// until a job registers the same names. 0: keep them (daemon/registry/forget.cpp).
  std::chrono::milliseconds forget_after{0};
};

}  // namespace muon::daemon
