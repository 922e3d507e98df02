#include "cli/status_command.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "cli/command_error.hpp"
#include "cli/job_manifest.hpp"
#include "cli/job_status.hpp"
#include "cli/socket_probe.hpp"
#include "cli/status_text.hpp"
#include "cli/text_table.hpp"
#include "client/client_error.hpp"
#include "client/health_probe.hpp"
#include "daemon/socket_path.hpp"

namespace muon::cli {
namespace {

using nlohmann::json;

constexpr int kExitNoServer = 2;
constexpr int kExitHung = 3;  // a process holds the socket but does not answer

std::string ranks_text(const json& a) {
  std::string s;
  for (const auto& r : a) s += (s.empty() ? "" : ", ") + std::to_string(r.get<int>());
  return "[" + s + "]";
}

std::string parameter_state(const json& p) {
  if (!get_or(p, "registered", true)) {
    return p.contains("missing_ranks")
               ? "registering, waiting for ranks " + ranks_text(p["missing_ranks"])
               : "registering";
  }
  if (get_or(p, "computing", false)) return "computing";
  if (p.contains("gathering_step")) {
    const double for_s = get_or(p, "gathering_for_s", -1.0);
    return "gathering step " + std::to_string(p["gathering_step"].get<int64_t>()) +
           (for_s >= 0 ? " for " + wait_text(for_s) : std::string()) + ", missing ranks " +
           ranks_text(p.value("missing_ranks", json::array()));
  }
  if (p.contains("forgotten_in_s")) {
    return "idle, its job gone: forgotten in " + wait_text(p["forgotten_in_s"].get<double>());
  }
  return "idle";
}

// "0.8119 (expected 0.8107) @3", "0.9500 (expected 0.4100) UNHEALTHY @7".
std::string health_text(const json& p) {
  auto it = p.find("health");
  if (it == p.end()) return "-";
  const auto& h = *it;
  auto number = [](const json& v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4f", v.get<double>());
    return std::string(buf);
  };
  std::string s = h.contains("orthogonality_error") && !h["orthogonality_error"].is_null()
                      ? number(h["orthogonality_error"])
                      : "n/a";
  if (h.contains("expected_error") && !h["expected_error"].is_null()) {
    s += " (expected " + number(h["expected_error"]) + ")";
  }
  const auto bad = get_or<int64_t>(h, "nonfinite", 0);
  if (bad != 0) s += " (" + std::to_string(bad) + " non-finite)";
  if (get_or(h, "unhealthy", false)) s += " UNHEALTHY";
  return s + " @" + std::to_string(get_or<int64_t>(h, "step", -1));
}

}  // namespace

std::string format_status(const json& st, const std::string& socket) {
  std::ostringstream out;
  out << get_or<std::string>(st, "server_version", "muon-offloadd") << " at " << socket;
  if (st.contains("backend")) out << " (backend " << st["backend"].get<std::string>() << ")";
  if (st.contains("uptime_s")) out << ", up " << duration_text(st["uptime_s"].get<double>());
  if (get_or(st, "stopping", false)) out << ", SHUTTING DOWN";
  out << "\n";

  std::vector<std::vector<std::string>> clients = {
      {"RANK", "NAME", "PENDING CHUNKS", "LAST STEP", "EXPOSED WAIT", "SLOWEST PARAMETER"}};
  int probes = 0;
  const json sessions = st.value("sessions", json::array());
  for (const auto& s : sessions) {
    const int rank = get_or(s, "rank", -1);
    if (rank < 0) {
      ++probes;  // health checks, status requests (this one too)
      continue;
    }
    std::vector<std::string> row = {std::to_string(rank),
                                    get_or<std::string>(s, "client", ""),
                                    std::to_string(get_or<int64_t>(s, "pending_chunks", 0)),
                                    "-",
                                    "-",
                                    "-"};
    if (s.contains("last_report")) {
      const auto& r = s["last_report"];
      row[3] = std::to_string(get_or<int64_t>(r, "step", -1));
      row[4] = wait_text(get_or(r, "exposed_wait_s", 0.0));
      row[5] = get_or<std::string>(r, "slowest_parameter", "");
      if (row[5].empty()) row[5] = "-";
    }
    clients.push_back(std::move(row));
  }
  const auto params = st.value("parameters", json::array());
  out << "world size " << get_or(st, "world_size", 0) << ", " << clients.size() - 1
      << " client(s), " << params.size()
      << " parameter(s); queue: " << get_or<int64_t>(st, "queued", 0) << " queued, "
      << get_or<int64_t>(st, "in_flight", 0) << " in flight\n";
  if (!get_or<std::string>(st, "metrics_url", "").empty()) {
    out << "metrics: " << st["metrics_url"].get<std::string>() << "\n";
  }

  out << "\nclients\n";
  if (clients.size() == 1) {
    out << "  (none connected)\n";
  } else {
    print_table(out, clients, "  ");
  }
  if (probes > 1) out << "  (+" << probes - 1 << " other connection(s) without hello)\n";

  out << "\nparameters\n";
  if (params.empty()) {
    out << "  (none registered)\n";
  } else {
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "SHAPE", "LAST STEP", "CONTRIBUTORS", "STATE", "ORTHOGONALITY ERROR", "ROLE"}};
    for (const auto& p : params) {
      // With a plan a parameter is owned here or relayed to its owner; without one, every
      // parameter is owned by the server that has it.
      const std::string role =
          p.contains("relayed_to")
              ? "relay -> server " + std::to_string(p["relayed_to"].get<int>())
              : (st.contains("plan")
                     ? "owner (server " + std::to_string(get_or(st["plan"], "server_id", -1)) + ")"
                     : "owner");
      rows.push_back(
          {get_or<std::string>(p, "name", "?"), get_or<std::string>(p, "shape", "-"),
           std::to_string(get_or<int64_t>(p, "last_step", -1)),
           p.contains("contributors") ? std::to_string(p["contributors"].get<int>()) : "-",
           parameter_state(p), health_text(p), role});
    }
    print_table(out, rows, "  ");
  }

  // auto's Newton-Schulz choices, per block shape: what runs and why (like `schedules`).
  const json choices = st.value("ns_choices", json::array());
  out << "\nnewton-schulz (--algorithm auto, per block)\n";
  if (choices.empty()) {
    out << "  (none made yet: a block shape is chosen for at its first step)\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"BLOCK", "ALGORITHM", "BATCHING", "WHY"}};
    for (const auto& c : choices) {
      const std::string batch_why = get_or<std::string>(c, "batch_reason", "");
      rows.push_back({get_or<std::string>(c, "key", "?"), get_or<std::string>(c, "algorithm", "?"),
                      get_or(c, "side_by_side", false) ? "side by side" : "one at a time",
                      get_or<std::string>(c, "reason", "") +
                          (batch_why.empty() ? "" : "; " + batch_why)});
    }
    print_table(out, rows, "  ");
  }

  out << "\nerrors: ";
  std::string errors;
  const json error_counts = st.value("errors", json::object());
  for (const auto& [code, n] : error_counts.items()) {
    if (n.get<int64_t>() != 0) {
      errors += (errors.empty() ? "" : ", ") + code + " " + std::to_string(n.get<int64_t>());
    }
  }
  out << (errors.empty() ? "none" : errors) << "\n";

  out << "last snapshot: ";
  if (st.contains("last_snapshot") && !st["last_snapshot"].is_null()) {
    const auto& s = st["last_snapshot"];
    out << get_or<std::string>(s, "path", "?") << " (" << duration_text(get_or(s, "age_s", -1.0))
        << " ago)\n";
  } else {
    const auto configured = get_or<std::string>(st, "snapshot_path", "");
    out << "none yet"
        << (configured.empty() ? " (no --snapshot path)" : " (--snapshot " + configured + ")")
        << "\n";
  }
  return out.str();
}

namespace {

// The job view of every manifest of `job` (all live jobs when empty). Exit 2 when there is none;
// 1 when a server of it does not answer.
void show_jobs(const std::string& job, const std::string& socket_hint, bool as_json,
               std::chrono::milliseconds timeout, std::chrono::milliseconds window) {
  std::vector<std::string> skipped;
  auto manifests = find_job_manifests(&skipped);
  std::vector<JobManifest> chosen;
  for (auto& m : manifests) {
    if (job.empty() ? m.launcher_alive() : m.job == job) chosen.push_back(std::move(m));
  }
  if (chosen.empty()) {
    std::string known;
    for (const auto& m : manifests) known += (known.empty() ? "" : ", ") + m.job;
    throw CommandFailed(
        kExitNoServer, (job.empty() ? socket_hint + "no job is running" : "no job '" + job + "'") +
                           " in " + jobs_directory() +
                           (known.empty() ? " (the launcher, scripts/muon-offload-launch, writes a "
                                            "manifest there while a job runs)"
                                          : " (jobs there: " + known + ")"));
  }
  bool all_up = true;
  nlohmann::json docs = nlohmann::json::array();
  for (size_t i = 0; i < chosen.size(); ++i) {
    const auto answers =
        ask_job(chosen[i], timeout, as_json ? std::chrono::milliseconds(0) : window);
    for (const auto& a : answers) all_up = all_up && a.status.has_value();
    if (as_json) {
      nlohmann::json servers = nlohmann::json::array();
      for (const auto& a : answers) {
        servers.push_back(
            {{"index", a.server.index},
             {"socket", a.server.socket},
             {"status", a.status ? *a.status : nlohmann::json(nullptr)},
             {"problem", a.status ? nlohmann::json(nullptr) : nlohmann::json(no_answer_text(a))}});
      }
      docs.push_back({{"job", chosen[i].job},
                      {"node_rank", chosen[i].node_rank},
                      {"manifest", chosen[i].path},
                      {"servers", servers}});
    } else {
      std::cout << (i ? "\n" : "") << format_job_status(chosen[i], answers);
    }
  }
  if (as_json) std::cout << docs.dump(2) << "\n";
  for (const auto& line : skipped)
    std::cerr << "muon-offload: skipped a manifest: " << line << "\n";
  if (!all_up) throw CommandFailed(1, "a server of the job does not answer (see above)");
}

}  // namespace

void add_status_command(CLI::App& app) {
  struct Args {
    std::string socket;
    std::string job;
    bool json = false;
    int64_t timeout_ms = 2000;
    int64_t rate_window_ms = 1000;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "status",
      "Show what a running muon-offloadd is doing (clients, parameters, queue, errors), or every "
      "server of a job started by scripts/muon-offload-launch (--job)");
  auto* socket_opt = sub->add_option(
      "--socket", args->socket,
      "The server's Unix socket (default: $MUON_OFFLOAD_SOCKET, else "
      "$XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock, else "
      "/tmp/muon-offload-<uid>/muon-offloadd.sock; when nothing is there, the running jobs)");
  sub->add_option("--job", args->job,
                  "Every server of this job (its name in the launcher's manifest, "
                  "--job-name or $SLURM_JOB_ID): state, step rate, what is being gathered and "
                  "for how long, the slowest rank and parameter, owners and relays")
      ->excludes(socket_opt);
  sub->add_flag("--json", args->json, "Print the server's status JSON instead of tables");
  sub->add_option("--timeout-ms", args->timeout_ms, "How long to keep trying to reach a server")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  sub->add_option("--rate-window-ms", args->rate_window_ms,
                  "Job view: ask each server again after this long for its step rate (0: no rate)")
      ->check(CLI::Range(int64_t{0}, int64_t{600000}))
      ->capture_default_str();
  sub->callback([args] {
    const auto timeout = std::chrono::milliseconds(args->timeout_ms);
    const auto window = std::chrono::milliseconds(args->rate_window_ms);
    if (!args->job.empty()) {
      show_jobs(args->job, "", args->json, timeout, window);
      return;
    }
    const std::string socket = args->socket.empty() ? daemon::default_socket_path() : args->socket;
    if (socket.starts_with("tcp://")) {
      throw CommandFailed(kExitNoServer,
                          "status is not available over TCP ('" + socket +
                              "'): a TCP peer gets nothing but health before a token-checked "
                              "hello; run `muon-offload status --socket PATH` on the server's "
                              "node with its Unix socket");
    }
    std::error_code fs_ec;
    const auto kind = std::filesystem::status(socket, fs_ec).type();
    if (args->socket.empty() && kind == std::filesystem::file_type::not_found) {
      // No server at the default socket: the jobs the launcher runs.
      show_jobs("", "no muon-offloadd at the default socket " + socket + " and ", args->json,
                timeout, window);
      return;
    }
    if (!fs_ec && kind != std::filesystem::file_type::socket &&
        kind != std::filesystem::file_type::not_found) {
      throw CommandFailed(
          kExitNoServer, "'" + socket + "' is not a socket (" +
                             (kind == std::filesystem::file_type::directory ? "a directory"
                                                                            : "not a socket file") +
                             "): no muon-offloadd listens there; pass the server's --socket path");
    }
    std::string text;
    try {
      text = client::fetch_status(socket, timeout);
    } catch (const client::ConnectionLost& e) {
      const SocketProbe probe = probe_unix_socket(socket);
      if (probe.state == SocketProbe::State::listening) {
        // Alive but not answering: starting another server there would take its socket away.
        throw CommandFailed(
            kExitHung,
            "muon-offloadd on '" + socket + "' is hung: a process (pid " +
                (probe.pid > 0 ? std::to_string(probe.pid) : std::string("?")) +
                ") listens there but did not answer status within " +
                std::to_string(args->timeout_ms) +
                " ms. Do not start another server on this socket. Look at its log and its "
                "threads" +
                (probe.pid > 0 ? " (gdb -p " + std::to_string(probe.pid) +
                                     " -batch -ex 'thread apply all bt')"
                               : std::string()) +
                ", wait longer (--timeout-ms), or stop it (SIGTERM writes its --snapshot) and "
                "restart it with --restore");
      }
      throw CommandFailed(kExitNoServer, "no muon-offloadd answers on '" + socket +
                                             "': " + e.message() +
                                             " (is it running? start one with `muon-offloadd "
                                             "--socket " +
                                             socket + "`)");
    }
    json st;
    try {
      st = json::parse(text);
    } catch (const json::exception& e) {
      throw Error("the server at '" + socket + "' sent a status that is not JSON: " + e.what());
    }
    if (args->json) {
      std::cout << st.dump(2) << "\n";
    } else {
      std::cout << format_status(st, socket);
    }
  });
}

}  // namespace muon::cli
