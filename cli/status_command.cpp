#include "cli/status_command.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "cli/command_error.hpp"
#include "cli/text_table.hpp"
#include "client/client_error.hpp"
#include "client/health_probe.hpp"
#include "daemon/socket_path.hpp"

namespace muon::cli {
namespace {

using nlohmann::json;

constexpr int kExitNoServer = 2;

// 3723.4 s -> "1h 02m 03s"; 12.5 -> "12.5 s".
std::string duration_text(double s) {
  if (!(s >= 0.0)) return "?";
  char buf[64];
  if (s < 60.0) {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  } else {
    const auto t = static_cast<long long>(s);
    if (t < 3600) {
      std::snprintf(buf, sizeof buf, "%lldm %02llds", t / 60, t % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%lldh %02lldm %02llds", t / 3600, (t / 60) % 60, t % 60);
    }
  }
  return buf;
}

// A wait in seconds, in the unit that reads best.
std::string wait_text(double s) {
  char buf[64];
  if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  } else if (s < 1.0) {
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  }
  return buf;
}

std::string ranks_text(const json& a) {
  std::string s;
  for (const auto& r : a) s += (s.empty() ? "" : ", ") + std::to_string(r.get<int>());
  return "[" + s + "]";
}

template <class T>
T get_or(const json& j, const char* key, T def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  return it->get<T>();
}

std::string parameter_state(const json& p) {
  if (!get_or(p, "registered", true)) {
    return p.contains("missing_ranks")
               ? "registering, waiting for ranks " + ranks_text(p["missing_ranks"])
               : "registering";
  }
  if (get_or(p, "computing", false)) return "computing";
  if (p.contains("gathering_step")) {
    return "gathering step " + std::to_string(p["gathering_step"].get<int64_t>()) +
           ", missing ranks " + ranks_text(p.value("missing_ranks", json::array()));
  }
  return "idle";
}

std::string health_text(const json& p) {
  auto it = p.find("health");
  if (it == p.end()) return "-";
  const auto& h = *it;
  std::string s;
  if (h.contains("orthogonality_error") && !h["orthogonality_error"].is_null()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4f", h["orthogonality_error"].get<double>());
    s = buf;
  } else {
    s = "n/a";
  }
  const auto bad = get_or<int64_t>(h, "nonfinite", 0);
  if (bad != 0) s += " (" + std::to_string(bad) + " non-finite)";
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
        {"NAME", "SHAPE", "LAST STEP", "CONTRIBUTORS", "STATE", "ORTHOGONALITY ERROR"}};
    for (const auto& p : params) {
      rows.push_back(
          {get_or<std::string>(p, "name", "?"), get_or<std::string>(p, "shape", "-"),
           std::to_string(get_or<int64_t>(p, "last_step", -1)),
           p.contains("contributors") ? std::to_string(p["contributors"].get<int>()) : "-",
           parameter_state(p), health_text(p)});
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

void add_status_command(CLI::App& app) {
  struct Args {
    std::string socket;
    bool json = false;
    int64_t timeout_ms = 2000;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "status", "Show what a running muon-offloadd is doing (clients, parameters, queue, errors)");
  sub->add_option("--socket", args->socket,
                  "The server's Unix socket (default: $MUON_OFFLOAD_SOCKET, else "
                  "$XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock, else "
                  "/tmp/muon-offload-<uid>/muon-offloadd.sock)");
  sub->add_flag("--json", args->json, "Print the server's status JSON instead of tables");
  sub->add_option("--timeout-ms", args->timeout_ms, "How long to keep trying to reach the server")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  sub->callback([args] {
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
      text = client::fetch_status(socket, std::chrono::milliseconds(args->timeout_ms));
    } catch (const client::ConnectionLost& e) {
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
