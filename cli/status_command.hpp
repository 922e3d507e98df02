// `muon-offload status [--socket PATH | --job NAME] [--json] [--timeout-ms T]`: what a running
// muon-offloadd is doing, asked without joining the job (the `status` message needs no hello):
// version and uptime, world size, clients (rank, name, pending chunks, last step report),
// parameters (shape, last step, contributors, the step being gathered and the ranks it misses,
// computing, numeric health, owner or relay), the queue, errors by code and the last snapshot.
// --json prints the server's JSON as it is. --job shows every server of a launcher's job
// (cli/job_status.hpp); so does a plain `status` when no server is at the default socket.
// Exit 2 when no server answers on the socket, 3 when a process holds it but does not answer
// (hung: no second server should be started there), 1 when a server of a job does not answer.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace muon::cli {

/// The readable report of a status JSON object (Engine::status_json) for the server at
/// `socket`. Fields a server does not send are left out.
std::string format_status(const nlohmann::json& status, const std::string& socket);

void add_status_command(CLI::App& app);

}  // namespace muon::cli
