// What operators see: the status JSON, the metrics' state gauges, and the numeric-health policy
// (when a sample warns; the measurement is daemon/numeric_health.hpp).
#include "daemon/engine.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "daemon/log.hpp"
#include "kernels/ns_choice.hpp"

namespace muon::daemon {

std::string Engine::status_json() const {
  using nlohmann::json;
  json j;
  j["server_version"] = "muon-offloadd " MUON_OFFLOAD_VERSION;
  j["backend"] = std::string(scheduler_.backend().name());
  j["uptime_s"] = metrics_.uptime_seconds();
  j["world_size"] = world_size_;
  if (routes_) {
    j["plan"] = {{"path", routes_->source()},
                 {"server_id", routes_->server_id()},
                 {"servers", routes_->servers()},
                 {"world_size", routes_->world_size()},
                 {"relays", routes_->relayed()}};
  }
  j["stopping"] = stopping_;
  j["queued"] = scheduler_.queued();
  int64_t in_flight = 0;
  for (const auto& [name, p] : params_) in_flight += p.phase() == Phase::computing ? 1 : 0;
  j["in_flight"] = in_flight;
  // What auto runs per block shape here and why (kernels/ns_choice.hpp): every choice this
  // server made, read from its table file or adopted from its snapshot.
  j["ns_choices"] = json::parse(ns_choices_to_json(NsChoiceTable::process().entries()));
  auto& sessions = j["sessions"] = json::array();
  for (const auto& [id, w] : sessions_) {
    auto s = w.lock();
    if (!s) continue;
    json e{{"id", id},
           {"rank", s->rank},
           {"client", s->client_name},
           {"pending_chunks", s->pending_chunks()}};
    if (auto r = reports_.find(id); r != reports_.end()) {
      e["last_report"] = {{"step", r->second.step},
                          {"exposed_wait_s", static_cast<double>(r->second.exposed_wait_ns) * 1e-9},
                          {"bytes_pushed", r->second.bytes_pushed},
                          {"parameters", r->second.parameters},
                          {"slowest_parameter", r->second.slowest_parameter}};
    }
    sessions.push_back(std::move(e));
  }
  // The replicas this server keeps as a buddy: each parameter's last sealed step and its owner.
  auto& replicas = j["replicas"] = json::array();
  for (const auto& [name, r] : replicas_.sealed()) {
    replicas.push_back({{"name", name}, {"step", r.step}, {"outcome", r.outcome},
                        {"source", r.source}});
  }
  auto& params = j["parameters"] = json::array();
  for (const auto& [name, p] : params_) {
    json e{{"name", name},
           {"registered", p.registered()},
           {"phase", phase_name(p.phase())},
           {"last_step", p.last_step()},
           {"computing", p.phase() == Phase::computing}};
    if (p.layout) {
      e["shape"] = p.layout->spec.shape.str();
      e["contributors"] = p.layout->contributors;
      e["registrants"] = p.layout->registrants;
      if (p.role && p.role->owner() >= 0) e["relayed_to"] = p.role->owner();  // owner's server id
      if (p.role && p.role->keeps_momentum_here()) {
        const int target = replica_target(name);
        if (target >= 0) e["replicated_to"] = target;  // its buddy's server id
      }
    } else if (p.pending) {
      e["missing_ranks"] = p.pending->missing_ranks();  // ranks that have not registered it
    }
    e["job"] = p.job;
    if (auto left = job_left_.find(p.job); left != job_left_.end()) {
      // --forget-finished-jobs-after: every session of its job has left; forgotten at the first
      // sweep after this (a sweep comes every quarter of the delay).
      const auto rest = config_.forget_after - (std::chrono::steady_clock::now() - left->second);
      e["forgotten_in_s"] = std::max(0.0, std::chrono::duration<double>(rest).count());
    }
    if (const auto* open = p.steps.gathering()) {
      e["gathering_step"] = open->step();
      e["missing_ranks"] = open->missing_ranks();
      // Since its first chunk: a long gathering is a rank that does not push or commit.
      e["gathering_for_s"] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - p.step_started).count();
    }
    if (p.health) {
      const auto number = [](double x) { return std::isnan(x) ? json(nullptr) : json(x); };
      e["health"] = {{"step", p.health_step},
                     {"nonfinite", p.health->nonfinite},
                     {"orthogonality_error", number(p.health->orthogonality_error)},
                     {"expected_error", number(p.health->expected_error)},
                     {"threshold", number(health_limit(*p.health))},
                     {"unhealthy", p.unhealthy}};
    }
    params.push_back(std::move(e));
  }
  auto& errors = j["errors"] = json::object();
  for (const auto& [code, n] : metrics_.error_counts()) errors[code] = static_cast<int64_t>(n);
  if (last_snapshot_time_) {
    const auto t = *last_snapshot_time_;
    j["last_snapshot"] = {
        {"path", last_snapshot_path_},
        {"unix_time", std::chrono::duration<double>(t.time_since_epoch()).count()},
        {"age_s", std::chrono::duration<double>(std::chrono::system_clock::now() - t).count()}};
  } else {
    j["last_snapshot"] = nullptr;
  }
  j["snapshot_path"] = config_.snapshot_path;
  j["metrics_url"] = metrics_url_;
  j["health_sample_every"] = config_.health_sample_every;
  return j.dump();
}

void Engine::refresh_metrics() {
  MetricsState st;
  for (const auto& [id, w] : sessions_) {
    auto s = w.lock();
    if (!s || s->closed()) continue;
    ++st.sessions_open;
    if (s->rank >= 0) ++st.clients_connected;
  }
  for (const auto& [name, p] : params_) {
    if (!p.registered()) continue;
    ++st.parameters_registered;
    st.scheduler_in_flight += p.phase() == Phase::computing ? 1 : 0;
    st.gathering += p.phase() == Phase::gathering ? 1 : 0;
    st.momentum_bytes += static_cast<int64_t>(p.momentum.size() * sizeof(float));
  }
  st.scheduler_queued = static_cast<int64_t>(scheduler_.queued());
  st.last_snapshot = last_snapshot_time_;
  metrics_.set_state(st);
}

double Engine::health_limit(const NumericHealth& h) const {
  return config_.health_warn_threshold ? *config_.health_warn_threshold : h.threshold;
}

void Engine::observe_health(const std::string& name, Param& p, const NsJob& job) {
  const NumericHealth& h = *job.health;
  metrics_.health(name, h);
  p.health = h;
  p.health_step = job.step;
  // The threshold is the sample's own (what the schedule gives this input, plus rounding), unless
  // --health-warn-threshold fixes one.
  const double limit = health_limit(h);
  const bool bad = h.nonfinite > 0 || !(h.orthogonality_error <= limit);
  if (bad && !p.unhealthy) {
    // Once per episode: again only after a sample back within the threshold.
    const std::string why =
        config_.health_warn_threshold ? std::string("--health-warn-threshold")
        : std::isnan(h.expected_error)
            ? "the band of schedule " + job.options.orthogonalize.schedule + " (no input sampled)"
            : fmt::format("schedule {} gives this input {:.4g}, plus the rounding allowance",
                          job.options.orthogonalize.schedule, h.expected_error);
    log()->warn(
        "parameter '{}' step {}: numeric health: orthogonality error {:.4g} above {:.4g} ({}; "
        "||X X^T - I||_F/sqrt(m) of the unscaled Newton-Schulz output), {} non-finite value(s)",
        name, job.step, h.orthogonality_error, limit, why, h.nonfinite);
  } else if (!bad && p.unhealthy) {
    log()->info("parameter '{}' step {}: numeric health back within the threshold ({:.4g})", name,
                job.step, h.orthogonality_error);
  }
  p.unhealthy = bad;
}

}  // namespace muon::daemon
