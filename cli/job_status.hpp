// `muon-offload status --job ID`: every server of a job in one view, from the launcher's job
// manifest (cli/job_manifest.hpp): per server its state (up, hung, gone), uptime, ranks,
// parameters owned and relayed, last step and step rate, parameters being gathered (and for how
// long), the slowest rank and parameter of its last step reports, errors and metrics endpoint;
// then the slowest rank of the job. Also `muon-offload health --job ID`.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/job_manifest.hpp"
#include "cli/socket_probe.hpp"

namespace muon::cli {

/// What asking one server of a job found.
struct ServerAnswer {
  JobServer server;
  std::optional<nlohmann::json> status;  ///< its status JSON, when it answered
  std::optional<nlohmann::json> later;   ///< a second answer rate_window later (step rate)
  double window_s = 0;                   ///< time between the two answers
  SocketProbe probe;                     ///< when it did not answer: who holds the socket
  std::string error;                     ///< when it did not answer: why
};

/// Asks every server of `job` for its status (each within `timeout`), and again after
/// `rate_window` when that is > 0, for the step rate.
std::vector<ServerAnswer> ask_job(const JobManifest& job, std::chrono::milliseconds timeout,
                                  std::chrono::milliseconds rate_window);

/// The readable job view.
std::string format_job_status(const JobManifest& job, const std::vector<ServerAnswer>& answers);

/// One line for a server that did not answer: hung (a process listens but does not answer; its
/// pid; do not start another on its socket), gone (nobody listens), or the error.
std::string no_answer_text(const ServerAnswer& a);

}  // namespace muon::cli
