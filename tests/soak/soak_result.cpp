#include "tests/soak/soak_result.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace muon::soak {

namespace {

// Least-squares slope of y over x.
double slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  if (x.size() < 2) return 0;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double d = n * sxx - sx * sx;
  return d == 0 ? 0 : (n * sxy - sx * sy) / d;
}

std::string mib(int64_t kib) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(kib) / 1024.0);
  return buf;
}

std::string join(const std::vector<std::string>& v, size_t max) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? "; " : "") + v[i];
  if (v.size() > max) s += "; ... (" + std::to_string(v.size() - max) + " more)";
  return s;
}

}  // namespace

RssFigures rss_figures(const std::vector<RssSample>& samples, const SoakConfig& c,
                       int64_t warmup_steps) {
  RssFigures f;
  std::vector<double> t, steps, rss, anon;
  for (const auto& s : samples) {
    if (!s.steady || s.progress < warmup_steps) continue;
    if (f.samples == 0) {
      f.first_kib = s.mem.vm_rss_kib;
      f.anon_first_kib = s.mem.rss_anon_kib;
    }
    ++f.samples;
    f.peak_kib = std::max(f.peak_kib, s.mem.vm_rss_kib);
    f.anon_peak_kib = std::max(f.anon_peak_kib, s.mem.rss_anon_kib);
    f.last_kib = s.mem.vm_rss_kib;
    f.anon_last_kib = s.mem.rss_anon_kib;
    t.push_back(s.t_s / 60.0);
    steps.push_back(static_cast<double>(s.progress) / 100.0);
    rss.push_back(static_cast<double>(s.mem.vm_rss_kib));
    anon.push_back(static_cast<double>(s.mem.rss_anon_kib));
  }
  f.slope_kib_per_min = slope(t, rss);
  f.anon_slope_kib_per_min = slope(t, anon);
  f.slope_kib_per_100_steps = slope(steps, rss);
  f.growth_kib = f.last_kib - f.first_kib;
  f.bound_kib = std::max(static_cast<int64_t>(c.rss_bound_mib * 1024),
                         static_cast<int64_t>(c.rss_bound_pct / 100.0 * f.first_kib));
  return f;
}

bool judge(SoakResult& r, const SoakConfig& c) {
  auto& f = r.failures;
  auto add_all = [&](const std::vector<std::string>& what, const std::string& prefix) {
    for (size_t i = 0; i < what.size() && i < 10; ++i) f.push_back(prefix + what[i]);
    if (what.size() > 10) {
      f.push_back(prefix + std::to_string(what.size() - 10) + " more (see result.json)");
    }
  };
  add_all(r.hangs, "hang: ");
  add_all(r.rank_failures, "rank process: ");
  add_all(r.unexpected, "unexpected error: ");
  add_all(r.mismatches, "update mismatch: ");
  if (r.steps_checked == 0) f.push_back("no update was checked");
  if (c.kill_every > 0 && r.steps_reached > c.kill_every && r.kill_events == 0) {
    f.push_back("no rank was killed");
  }
  const auto& rss = r.rss_after_warmup;
  if (rss.samples < 2) {
    f.push_back("fewer than 2 steady RSS samples after warm-up: run longer or lower --warmup");
  } else if (rss.growth_kib > rss.bound_kib) {
    f.push_back("server VmRSS grew by " + mib(rss.growth_kib) + " after warm-up (bound " +
                mib(rss.bound_kib) + ")");
  }
  if (r.server_mapped_after != 0) {
    f.push_back("the server still maps " + std::to_string(r.server_mapped_after) +
                " segment(s) after every client left");
  }
  if (!r.segments_left.empty())
    f.push_back("segments left in /dev/shm: " + join(r.segments_left, 8));
  if (!r.segments_left_after_exit.empty()) {
    f.push_back("segments left after the server exited: " + join(r.segments_left_after_exit, 8));
  }
  if (!r.server_exit || *r.server_exit != 0) {
    f.push_back("the server did not exit 0 on SIGTERM (" +
                (r.server_exit ? "exit " + std::to_string(*r.server_exit) : "still running") + ")");
  }
  return f.empty();
}

std::string summary_text(const SoakResult& r, const SoakConfig& c) {
  std::ostringstream o;
  const auto& f = r.rss_after_warmup;
  char buf[512];
  o << "soak: " << c.clients << " clients, " << c.shapes << " parameters, " << r.steps_reached
    << " steps reached in " << static_cast<int64_t>(r.wall_s) << " s; work dir " << r.work_dir
    << "\n";
  o << "  kills: " << r.kill_events << " events, " << r.ranks_killed << " rank(s) SIGKILLed, "
    << r.recoveries << " recoveries (" << r.unplanned_recoveries << " unplanned), "
    << r.hello_retries << " hello retries\n";
  std::string codes;
  for (const auto& [code, n] : r.errors_by_code) codes += " " + code + "=" + std::to_string(n);
  o << "  step errors reported:" << (codes.empty() ? " none" : codes)
    << "; unexpected: " << r.unexpected.size() << "\n";
  o << "  hangs: " << r.hangs.size() << " (bound " << c.hang_s << " s); rounds: " << r.rounds
    << ", longest " << r.max_round_ms << " ms; longest registration " << r.max_register_ms
    << " ms\n";
  o << "  updates: " << r.steps_checked << " (parameter, step) and " << r.updates_checked
    << " rank updates checked bitwise against the in-process reference; mismatches: "
    << r.mismatches.size() << "; completed steps no rank saw: " << r.steps_unlogged << "\n";
  std::snprintf(buf, sizeof buf,
                "  server VmRSS after warm-up (%d samples): first %s, peak %s, last %s, growth "
                "%s (bound %s), slope %.1f KiB/min, %.1f KiB/100 steps; RssAnon %s -> %s, "
                "slope %.1f KiB/min\n",
                f.samples, mib(f.first_kib).c_str(), mib(f.peak_kib).c_str(),
                mib(f.last_kib).c_str(), mib(f.growth_kib).c_str(), mib(f.bound_kib).c_str(),
                f.slope_kib_per_min, f.slope_kib_per_100_steps, mib(f.anon_first_kib).c_str(),
                mib(f.anon_last_kib).c_str(), f.anon_slope_kib_per_min);
  o << buf;
  if (r.rss_after_clients) {
    o << "  server VmRSS once the clients left: " << mib(r.rss_after_clients->vm_rss_kib)
      << " (RssShmem " << mib(r.rss_after_clients->rss_shmem_kib) << ")\n";
  }
  o << "  segments: " << r.segments_seen << " seen (" << r.abandoned_hellos
    << " from hellos that never mapped theirs); still mapped by the server after the clients: "
    << r.server_mapped_after << "; left in /dev/shm: " << r.segments_left.size()
    << ", after the server exited: " << r.segments_left_after_exit.size()
    << "; unattributed of this run's size: " << r.segments_same_size.size() << "; server exit "
    << (r.server_exit ? std::to_string(*r.server_exit) : std::string("none")) << "\n";
  o << (r.failures.empty() ? "soak: PASS" : "soak: FAIL") << "\n";
  for (const auto& x : r.failures) o << "  FAIL " << x << "\n";
  return o.str();
}

std::string result_json(const SoakResult& r, const SoakConfig& c) {
  nlohmann::json j;
  j["config"] = {{"clients", c.clients},
                 {"steps", c.steps},
                 {"kill_every", c.kill_every},
                 {"kill_max", c.kill_max},
                 {"duration_s", c.duration_s},
                 {"shapes", c.shapes},
                 {"backward_ms", c.backward_ms},
                 {"slot_kib", c.slot_kib},
                 {"seed", c.seed},
                 {"hang_s", c.hang_s},
                 {"rss_bound_mib", c.rss_bound_mib},
                 {"rss_bound_pct", c.rss_bound_pct}};
  j["wall_s"] = r.wall_s;
  j["steps_reached"] = r.steps_reached;
  j["kill_events"] = r.kill_events;
  j["ranks_killed"] = r.ranks_killed;
  j["recoveries"] = r.recoveries;
  j["unplanned_recoveries"] = r.unplanned_recoveries;
  j["rounds"] = r.rounds;
  j["max_round_ms"] = r.max_round_ms;
  j["max_register_ms"] = r.max_register_ms;
  j["hello_retries"] = r.hello_retries;
  j["errors_by_code"] = r.errors_by_code;
  j["unexpected"] = r.unexpected;
  j["hangs"] = r.hangs;
  j["rank_failures"] = r.rank_failures;
  j["steps_checked"] = r.steps_checked;
  j["updates_checked"] = r.updates_checked;
  j["steps_unlogged"] = r.steps_unlogged;
  j["mismatches"] = r.mismatches;
  const auto& f = r.rss_after_warmup;
  j["rss_after_warmup"] = {{"samples", f.samples},
                           {"first_kib", f.first_kib},
                           {"peak_kib", f.peak_kib},
                           {"last_kib", f.last_kib},
                           {"growth_kib", f.growth_kib},
                           {"bound_kib", f.bound_kib},
                           {"slope_kib_per_min", f.slope_kib_per_min},
                           {"slope_kib_per_100_steps", f.slope_kib_per_100_steps},
                           {"anon_first_kib", f.anon_first_kib},
                           {"anon_peak_kib", f.anon_peak_kib},
                           {"anon_last_kib", f.anon_last_kib},
                           {"anon_slope_kib_per_min", f.anon_slope_kib_per_min}};
  auto& s = j["rss_samples"] = nlohmann::json::array();
  for (const auto& x : r.rss) {
    s.push_back(
        {x.t_s, x.progress, x.mem.vm_rss_kib, x.mem.rss_anon_kib, x.mem.rss_shmem_kib, x.steady});
  }
  j["rss_samples_columns"] = {"t_s",          "progress",      "vm_rss_kib",
                              "rss_anon_kib", "rss_shmem_kib", "steady"};
  if (r.rss_after_clients) j["rss_after_clients_kib"] = r.rss_after_clients->vm_rss_kib;
  j["segments_seen"] = r.segments_seen;
  j["abandoned_hellos"] = r.abandoned_hellos;
  j["server_mapped_after"] = r.server_mapped_after;
  j["segments_left"] = r.segments_left;
  j["segments_left_after_exit"] = r.segments_left_after_exit;
  j["segments_same_size"] = r.segments_same_size;
  j["segment_bytes"] = c.segment_bytes();
  j["server_exit"] = r.server_exit ? nlohmann::json(*r.server_exit) : nlohmann::json();
  j["failures"] = r.failures;
  j["pass"] = r.failures.empty();
  return j.dump(1);
}

}  // namespace muon::soak
