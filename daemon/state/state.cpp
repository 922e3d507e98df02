// Momentum state: snapshots (and the requests that wait for steps in flight), state fetches and
// momentum loads, for owned parameters here and relayed ones through their owner.
#include "daemon/engine.hpp"

#include <cstring>

#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

using transport::ErrorMsg;
using transport::Frame;
using transport::MessageType;

void Engine::load_momentum(const transport::Push& m, Param& p, std::span<const float> values) {
  p.steps.load(m.step);  // throws while a step is open
  p.role->load_momentum(m, p, values);
}

const std::vector<float>& Engine::host_momentum(Param& p) {
  p.storage->refresh_momentum(p.momentum);
  return p.momentum;
}

void Engine::write_snapshot_now(const std::string& path) {
  std::vector<SnapshotEntry> entries;
  for (auto& [name, p] : params_) {
    if (!p.registered() || !p.role->keeps_momentum_here()) continue;  // else the owner's
    entries.push_back({name, dims_of(p.layout->spec.shape), p.last_step(), p.layout->spec.options,
                       host_momentum(p)});
  }
  write_snapshot(path, entries);
  last_snapshot_path_ = path;
  last_snapshot_time_ = std::chrono::system_clock::now();
  log()->info("snapshot of {} parameter(s) written to {}", entries.size(), path);
}

void Engine::on_snapshot(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::SnapshotRequest>(f.payload);
  const std::string path = m.path.empty() ? config_.snapshot_path : m.path;
  if (path.empty()) {
    throw InvalidArgument("snapshot: no path given and the server has no --snapshot path");
  }
  if (any_computing()) {  // never save a half-applied momentum: wait for the work in flight
    snapshot_waiters_.emplace_back(s, std::make_pair(path, f.request_id));
    return;
  }
  try {
    write_snapshot_now(path);
  } catch (const Error& e) {
    reply_error(s, {"snapshot", e.message(), "", -1, -1}, f.request_id);
    return;
  }
  s->send(MessageType::snapshot_ok,
          transport::encode(transport::SnapshotOk{path, static_cast<int>(params_.size())}),
          f.request_id);
}

void Engine::on_state_fetch(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::StateFetch>(f.payload);
  Param* pp = nullptr;
  try {
    pp = &registered_param(m.name, s);
    if (pp->phase() == Phase::computing) {
      throw InvalidArgument("parameter '" + m.name +
                            "': momentum requested while a step is computing");
    }
  } catch (const InvalidArgument& e) {
    // Named after the parameter, so that only this fetch fails on the client.
    reply_error(s, {"bad_request", e.message(), m.name, -1, s->rank}, f.request_id);
    return;
  }
  pp->role->fetch_momentum(s, m.name, *pp, f.request_id);
}

}  // namespace muon::daemon
