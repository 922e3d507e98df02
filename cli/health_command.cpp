#include "cli/health_command.hpp"

#include <iostream>
#include <memory>
#include <string>

#include "cli/command_error.hpp"
#include "cli/job_manifest.hpp"
#include "cli/job_status.hpp"
#include "cli/socket_probe.hpp"
#include "client/client_error.hpp"
#include "client/health_probe.hpp"
#include "daemon/socket_path.hpp"

namespace muon::cli {
namespace {

// Every server of the job's manifests healthy within the timeout, or the list of those that are
// not (hung, gone), exit 1.
void check_job(const std::string& job, std::chrono::milliseconds timeout) {
  std::vector<JobManifest> chosen;
  for (auto& m : find_job_manifests()) {
    if (m.job == job) chosen.push_back(std::move(m));
  }
  if (chosen.empty()) {
    throw CommandFailed(2, "no job '" + job + "' in " + jobs_directory());
  }
  std::string bad;
  int servers = 0;
  for (const auto& m : chosen) {
    for (const auto& s : m.servers) {
      ++servers;
      try {
        const auto h = client::wait_healthy(s.socket, timeout);
        std::cout << "ready: node " << m.node_rank << " server " << s.index << " " << s.socket
                  << " (" << h.sessions << " session(s), " << h.parameters << " parameter(s))\n";
      } catch (const client::ConnectionLost& e) {
        ServerAnswer a;
        a.server = s;
        a.error = e.message();
        a.probe = probe_unix_socket(s.socket);
        bad += "\n  node " + std::to_string(m.node_rank) + " server " + std::to_string(s.index) +
               ": " + no_answer_text(a);
      }
    }
  }
  if (!bad.empty()) {
    throw CommandFailed(1, "job '" + job + "': not every server of " + std::to_string(servers) +
                               " is healthy:" + bad);
  }
}

}  // namespace

void add_health_command(CLI::App& app) {
  struct Args {
    std::string socket;
    std::string job;
    int64_t timeout_ms = 10000;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "health",
      "Wait until a muon-offloadd (or every server of a job) answers health checks as ready "
      "(exit 0), or fail");
  auto* socket = sub->add_option("--socket", args->socket,
                                 "The server's Unix socket (default: the one muon-offloadd "
                                 "listens on without --socket: $MUON_OFFLOAD_SOCKET, else "
                                 "$XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock, else "
                                 "/tmp/muon-offload-<uid>/muon-offloadd.sock)");
  auto* job = sub->add_option("--job", args->job,
                              "Every server of this job (scripts/muon-offload-launch's manifest)");
  socket->excludes(job);
  job->excludes(socket);
  sub->add_option("--timeout-ms", args->timeout_ms, "How long to keep trying (per server)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  sub->callback([args] {
    const auto timeout = std::chrono::milliseconds(args->timeout_ms);
    if (!args->job.empty()) {
      check_job(args->job, timeout);
      return;
    }
    // As `status`: no --socket is the server started without one.
    const std::string socket = args->socket.empty() ? daemon::default_socket_path() : args->socket;
    const auto h = client::wait_healthy(socket, timeout);
    std::cout << "ready: " << socket << " (" << h.sessions << " session(s), " << h.parameters
              << " parameter(s))\n";
  });
}

}  // namespace muon::cli
