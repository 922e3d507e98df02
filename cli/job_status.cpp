#include "cli/job_status.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <thread>

#include "cli/status_text.hpp"
#include "cli/text_table.hpp"
#include "client/client_error.hpp"
#include "client/health_probe.hpp"

namespace muon::cli {
namespace {

using nlohmann::json;

std::optional<json> ask(const std::string& socket, std::chrono::milliseconds timeout,
                        std::string& error) {
  try {
    return json::parse(client::fetch_status(socket, timeout));
  } catch (const client::ConnectionLost& e) {
    error = e.message();
  } catch (const json::exception& e) {
    error = std::string("a status that is not JSON: ") + e.what();
  } catch (const std::exception& e) {
    error = e.what();
  }
  return std::nullopt;
}

// The largest last_step over the parameters, or -1.
int64_t last_step(const json& st) {
  int64_t step = -1;
  for (const auto& p : st.value("parameters", json::array())) {
    step = std::max(step, get_or<int64_t>(p, "last_step", -1));
  }
  return step;
}

// The session whose last step report waited longest: (rank, wait, slowest parameter).
struct Slowest {
  int rank = -1;
  double wait_s = -1;
  std::string parameter;
};

Slowest slowest_rank(const json& st) {
  Slowest s;
  for (const auto& session : st.value("sessions", json::array())) {
    if (get_or(session, "rank", -1) < 0 || !session.contains("last_report")) continue;
    const auto& r = session["last_report"];
    const double wait = get_or(r, "exposed_wait_s", 0.0);
    if (wait > s.wait_s) {
      s.rank = get_or(session, "rank", -1);
      s.wait_s = wait;
      s.parameter = get_or<std::string>(r, "slowest_parameter", "");
    }
  }
  return s;
}

std::string slowest_text(const Slowest& s) {
  if (s.rank < 0) return "-";
  return "rank " + std::to_string(s.rank) + " " + wait_text(s.wait_s) +
         (s.parameter.empty() ? "" : " (" + s.parameter + ")");
}

// "2, longest 3.4 s (fc1.weight, missing [1])" for the parameters being gathered.
std::string gathering_text(const json& st) {
  int n = 0;
  double longest = -1;
  std::string name, missing;
  for (const auto& p : st.value("parameters", json::array())) {
    if (!p.contains("gathering_step")) continue;
    ++n;
    const double for_s = get_or(p, "gathering_for_s", 0.0);
    if (for_s > longest) {
      longest = for_s;
      name = get_or<std::string>(p, "name", "?");
      missing.clear();
      for (const auto& r : p.value("missing_ranks", json::array())) {
        missing += (missing.empty() ? "" : ",") + std::to_string(r.get<int>());
      }
    }
  }
  if (n == 0) return "-";
  std::string out = std::to_string(n);
  if (longest > 0) out += ", longest " + wait_text(longest);
  out += " (" + name + (missing.empty() ? "" : ", missing [" + missing + "]") + ")";
  return out;
}

int64_t error_total(const json& st) {
  int64_t n = 0;
  const json errors = st.value("errors", json::object());  // items() must not outlive it
  for (const auto& [code, count] : errors.items()) n += count.get<int64_t>();
  return n;
}

}  // namespace

std::vector<ServerAnswer> ask_job(const JobManifest& job, std::chrono::milliseconds timeout,
                                  std::chrono::milliseconds rate_window) {
  std::vector<ServerAnswer> out;
  for (const auto& s : job.servers) {
    ServerAnswer a;
    a.server = s;
    a.status = ask(s.socket, timeout, a.error);
    if (!a.status) a.probe = probe_unix_socket(s.socket);
    out.push_back(std::move(a));
  }
  if (rate_window.count() > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(rate_window);
    for (auto& a : out) {
      if (!a.status) continue;
      std::string ignored;
      a.later = ask(a.server.socket, timeout, ignored);
      a.window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  return out;
}

std::string no_answer_text(const ServerAnswer& a) {
  const auto& s = a.server;
  switch (a.probe.state) {
    case SocketProbe::State::listening:
      return "hung: a process (pid " +
             (a.probe.pid > 0 ? std::to_string(a.probe.pid) : std::string("?")) + ") listens on " +
             s.socket +
             " but did not answer status in time; it is alive, so do not start another server "
             "on that socket. Its log: " +
             s.log +
             (a.probe.pid > 0 ? "; its threads: gdb -p " + std::to_string(a.probe.pid) +
                                    " -batch -ex 'thread apply all bt'"
                              : "");
    case SocketProbe::State::refused:
      return "gone: nobody listens on " + s.socket + " (the server exited; its log: " + s.log + ")";
    case SocketProbe::State::missing:
      return "gone: no socket at " + s.socket + " (its log: " + s.log + ")";
    case SocketProbe::State::other:
      break;
  }
  return "unreachable: " + a.error + (a.probe.error.empty() ? "" : " (" + a.probe.error + ")");
}

std::string format_job_status(const JobManifest& job, const std::vector<ServerAnswer>& answers) {
  std::ostringstream out;
  const double age = static_cast<double>(std::time(nullptr)) - job.started_unix;
  out << "job " << job.job << ", node " << job.node_rank << " on " << job.host << ": launcher pid "
      << job.launcher_pid << (job.launcher_alive() ? "" : " (GONE: this manifest is stale)")
      << ", up " << duration_text(age) << ", backend " << job.backend << "\n";
  if (!job.plan.empty()) out << "plan: " << job.plan << "\n";
  out << "run dir: " << job.run_dir << "; manifest: " << job.path << "\n\n";

  std::vector<std::vector<std::string>> rows = {
      {"SERVER", "PLAN ID", "GPU", "STATE", "UPTIME", "RANKS", "OWNS", "RELAYS", "LAST STEP",
       "STEPS/S", "GATHERING", "SLOWEST RANK (PARAMETER)", "ERRORS", "METRICS"}};
  Slowest job_slowest;
  int job_slowest_server = -1;
  std::vector<std::string> notes;
  for (const auto& a : answers) {
    const auto& s = a.server;
    std::vector<std::string> row = {std::to_string(s.index),
                                    s.plan_id ? std::to_string(*s.plan_id) : "-",
                                    s.gpu.empty() ? "-" : s.gpu};
    if (!a.status) {
      const auto state = a.probe.state == SocketProbe::State::listening ? "HUNG" : "GONE";
      row.push_back(state);
      notes.push_back("server " + std::to_string(s.index) + ": " + no_answer_text(a));
      rows.push_back(std::move(row));
      continue;
    }
    const json& st = a.later ? *a.later : *a.status;
    int ranks = 0, owns = 0, relays = 0;
    for (const auto& session : st.value("sessions", json::array())) {
      ranks += get_or(session, "rank", -1) >= 0 ? 1 : 0;
    }
    for (const auto& p : st.value("parameters", json::array())) {
      (p.contains("relayed_to") ? relays : owns) += 1;
    }
    std::string rate = "-";
    if (a.later && a.window_s > 0) {
      const int64_t d = last_step(*a.later) - last_step(*a.status);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(d) / a.window_s);
      rate = buf;
    }
    const Slowest slow = slowest_rank(st);
    if (slow.wait_s > job_slowest.wait_s) {
      job_slowest = slow;
      job_slowest_server = s.index;
    }
    const int64_t errors = error_total(st);
    row.insert(row.end(),
               {get_or(st, "stopping", false) ? "stopping" : "up",
                duration_text(get_or(st, "uptime_s", -1.0)), std::to_string(ranks),
                std::to_string(owns), std::to_string(relays), std::to_string(last_step(st)), rate,
                gathering_text(st), slowest_text(slow), errors == 0 ? "0" : std::to_string(errors),
                s.metrics_url.empty() ? "-" : s.metrics_url});
    rows.push_back(std::move(row));
  }
  print_table(out, rows, "  ");
  if (job_slowest.rank >= 0) {
    out << "\nslowest rank of the job: rank " << job_slowest.rank << " (server "
        << job_slowest_server << "), waited " << wait_text(job_slowest.wait_s)
        << " in its last step" << (job_slowest.parameter.empty() ? "" : ", last for ")
        << job_slowest.parameter << "\n";
  }
  for (const auto& n : notes) out << "\n" << n << "\n";
  out << "\none server in full: muon-offload status --socket SOCKET\n";
  return out.str();
}

}  // namespace muon::cli
