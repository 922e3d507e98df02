// A health check that does not join the job: connects, sends `health` (no hello), reads the
// answer. For launch scripts and probes that wait until a server can take registrations.
#pragma once

#include <chrono>
#include <string>

#include "transport/messages.hpp"

namespace muon::client {

/// Polls `socket_path` (a Unix socket path or "tcp://HOST:PORT"; health needs no token) until
/// the server answers `health` with ready, or `timeout` passes. Throws ConnectionLost (never
/// reachable, or reachable but never ready: the message says the last OS error or "server not
/// ready"); InvalidArgument (a malformed endpoint, a host that does not resolve).
transport::HealthOk wait_healthy(const std::string& socket_path, std::chrono::milliseconds timeout);

/// The server's status JSON (the `status` message), without joining the job. Unix sockets only:
/// over TCP the server answers nothing but health before a token-checked hello, so a tcp
/// endpoint throws InvalidArgument saying so (before connecting). Otherwise throws as
/// wait_healthy.
std::string fetch_status(const std::string& socket_path, std::chrono::milliseconds timeout);

}  // namespace muon::client
