// A health check that does not join the job: connects, sends `health` (no hello), reads the
// answer. For launch scripts and probes that wait until a server can take registrations.
#pragma once

#include <chrono>
#include <string>

#include "transport/messages.hpp"

namespace muon::client {

/// Polls `socket_path` until the server answers `health` with ready, or `timeout` passes.
/// Throws ConnectionLost (never reachable: the message says the last OS error) or Timeout
/// (reachable but not ready).
transport::HealthOk wait_healthy(const std::string& socket_path, std::chrono::milliseconds timeout);

/// The server's status JSON (the `status` message), without joining the job.
std::string fetch_status(const std::string& socket_path, std::chrono::milliseconds timeout);

}  // namespace muon::client
