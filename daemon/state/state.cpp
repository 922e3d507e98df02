// Momentum state: snapshots (and the requests that wait for steps in flight), state fetches and
// momentum loads, for owned parameters here and relayed ones through their owner.
#include "daemon/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::ErrorMsg;
using transport::Frame;
using transport::MessageType;

void Engine::load_momentum(const transport::Push& m, Param& p, std::span<const float> values) {
  p.steps.load(m.step);  // throws while a step is open
  p.role->load_momentum(m, p, values);
}

void Engine::with_host_momentum(const std::string& name, Param& p,
                                std::function<void(Param&, bool fresh)> then) {
  Param* param = &p;  // lives while its storage does: the storage runs the continuation only then
  p.storage->refresh_momentum(p.momentum, [this, param, name, then = std::move(then)](
                                              std::exception_ptr error) {
    if (error) {
      log()->error("parameter '{}': reading its momentum back from the GPU failed: {}", name,
                   message_of(error));
      metrics_.error(ErrorCode::backend);
    }
    then(*param, !error);
  });
}

const std::vector<float>& Engine::host_momentum_now(Param& p) {
  std::exception_ptr failed;
  bool done = false;
  p.storage->refresh_momentum(p.momentum, [&](std::exception_ptr error) {
    failed = error;
    done = true;
  });
  // Only this storage's copy is waited for; what is queued before it runs first, in order.
  while (!done) {
    if (!completions_.poll()) break;
  }
  if (failed) std::rethrow_exception(failed);
  return p.momentum;
}

void Engine::snapshot_entries(std::function<void(std::vector<SnapshotEntry>, bool)> then) {
  auto entries = std::make_shared<std::vector<SnapshotEntry>>();
  auto complete = std::make_shared<bool>(true);
  for (auto& [name, p] : params_) {
    if (!p.registered() || !p.role->keeps_momentum_here()) continue;  // else the owner's
    with_host_momentum(name, p, [entries, complete, name](Param& q, bool fresh) {
      if (!fresh) {
        *complete = false;
        return;
      }
      entries->push_back({name, dims_of(q.layout->spec.shape), q.last_step(),
                          q.layout->spec.options, q.momentum});
    });
  }
  if (completions_.pending() == 0) {  // the host path: every copy is there already
    then(std::move(*entries), *complete);
    return;
  }
  // After every copy above: the queue runs in order. A parameter unregistered meanwhile is not
  // in the set.
  completions_.when([] { return true; },
                    [entries, complete, then = std::move(then)](std::exception_ptr) {
                      then(std::move(*entries), *complete);
                    });
}

void Engine::request_snapshot(const SessionPtr& s, const std::string& path, uint32_t request_id) {
  snapshot_entries([this, w = std::weak_ptr<Session>(s), path, request_id](
                       std::vector<SnapshotEntry> entries, bool complete) {
    if (!complete) {
      const std::string error = "snapshot to " + path + " not written: a momentum could not be "
                                "read from the GPU (the server log says which)";
      log()->error("{}", error);
      if (auto ws = w.lock()) reply_error(ws, {ErrorCode::snapshot, error, "", -1, -1}, request_id);
      return;
    }
    write_requested_snapshot(w, path, request_id, std::move(entries));
  });
}

void Engine::write_requested_snapshot(const std::weak_ptr<Session>& s, const std::string& path,
                                      uint32_t request_id, std::vector<SnapshotEntry> entries) {
  const int count = static_cast<int>(entries.size());
  if (count > 0 && common_step(entries) == -2) {
    // A request between two step() calls of every rank has one step; this one came mid-step.
    log()->warn("snapshot to {} mixes steps: {}; a resume from it is refused unless it adopts "
                "each parameter's own step",
                path, describe_steps(entries));
  }
  writer_->write(path, std::move(entries),
                 [this, alive = std::weak_ptr<bool>(alive_), w = s, path, count,
                  request_id](const std::string& error) {
                   if (!alive.lock()) return;
                   auto ws = w.lock();
                   if (!error.empty()) {
                     log()->error("{}", error);
                     if (ws) reply_error(ws, {ErrorCode::snapshot, error, "", -1, -1}, request_id);
                     return;
                   }
                   last_snapshot_path_ = path;
                   last_snapshot_time_ = std::chrono::system_clock::now();
                   log()->info("snapshot of {} parameter(s) written to {}", count, path);
                   if (ws) {
                     ws->send(MessageType::snapshot_ok,
                              transport::encode(transport::SnapshotOk{path, count}), request_id);
                   }
                 });
}

void Engine::collect_periodic(const std::string& name, Param& p) {
  const int64_t every = config_.snapshot_every, step = p.last_step();
  if (every <= 0 || step < 0 || (step + 1) % every != 0 || !p.role->keeps_momentum_here()) return;
  if (periodic_ && periodic_->step > step) return;  // this parameter is behind: not in that one
  if (step == skipped_step_) return;                  // a step skipped (below)
  if (periodic_ && periodic_->step < step) {
    // Some parameter never got to the older step (it took no gradient, or registered late).
    log()->warn("periodic snapshot of step {} abandoned: {} of the parameters had it when '{}' "
                "reached step {} (a parameter without gradients holds every periodic snapshot "
                "back)",
                periodic_->step, periodic_->entries.size(), name, step);
    periodic_.reset();
  }
  if (!periodic_) {
    if (writer_->outstanding() >= 2) {
      // The disk is slower than N steps: one snapshot written, one waiting, no more copies; the
      // whole step is skipped (its other parameters too). Counted from write(), not from when
      // the writer thread starts one: a writer not scheduled yet is not a slow disk.
      skipped_step_ = step;
      if (skipped_periodic_++ == 0) {
        log()->warn("periodic snapshot of step {} skipped: the one before is still waiting to be "
                    "written (the disk is slower than --snapshot-every {} steps; a crash now "
                    "loses more than {} steps)",
                    step, every, every);
      }
      return;
    }
    periodic_ = PeriodicSnapshot{step, {}};
  }
  // The momentum comes to the host first (on the GPU data plane without the io thread
  // waiting); a periodic snapshot abandoned or written meanwhile takes no late entry.
  with_host_momentum(name, p, [this, name, step](Param& q, bool fresh) {
    if (!periodic_ || periodic_->step != step) return;
    if (!fresh) {
      log()->warn("periodic snapshot of step {} abandoned: the momentum of '{}' could not be "
                  "read from the GPU",
                  step, name);
      periodic_.reset();
      skipped_step_ = step;
      return;
    }
    const auto copy_start = std::chrono::steady_clock::now();
    periodic_->entries.push_back(
        {name, dims_of(q.layout->spec.shape), step, q.layout->spec.options, q.momentum});
    periodic_->copy_seconds += seconds_since(copy_start);
    write_periodic_when_complete();
  });
}

void Engine::write_periodic_when_complete() {
  const auto owned = std::count_if(params_.begin(), params_.end(), [](const auto& kv) {
    return kv.second.registered() && kv.second.role->keeps_momentum_here();
  });
  if (static_cast<int64_t>(periodic_->entries.size()) < owned) return;
  const int64_t step = periodic_->step;
  const int count = static_cast<int>(periodic_->entries.size());
  double mb = 0;
  for (const auto& e : periodic_->entries) mb += e.momentum.size() * sizeof(float) / 1e6;
  const double copy_ms = periodic_->copy_seconds * 1e3;
  const auto queued = std::chrono::steady_clock::now();
  writer_->write(config_.snapshot_path, std::move(periodic_->entries),
                 [this, alive = std::weak_ptr<bool>(alive_), step, count, mb, copy_ms,
                  queued](const std::string& error) {
                   if (!alive.lock()) return;
                   if (!error.empty()) {
                     log()->error("periodic snapshot of step {} failed: {}", step, error);
                     metrics_.error(ErrorCode::snapshot);
                     return;
                   }
                   last_snapshot_path_ = config_.snapshot_path;
                   last_snapshot_time_ = std::chrono::system_clock::now();
                   // The figures of its cost: copies on the io thread, then the writer's
                   // time (queue wait included) until the file was in place.
                   log()->info("periodic snapshot of step {} ({} parameter(s), {:.2f} MB) "
                               "written to {}: copies {:.3f} ms on the io thread, on disk "
                               "{:.1f} ms after",
                               step, count, mb, config_.snapshot_path, copy_ms,
                               seconds_since(queued) * 1e3);
                 });
  periodic_.reset();
}

void Engine::write_final_snapshot() {
  writer_->drain();  // the periodic snapshots queued before go first
  // Shutdown may wait for this server's own device copies (they wait on nothing else).
  std::optional<std::vector<SnapshotEntry>> got;
  bool complete = true;
  snapshot_entries([&](std::vector<SnapshotEntry> e, bool ok) {
    got = std::move(e);
    complete = ok;
  });
  while (!got && completions_.poll()) {
  }
  if (!got || !complete) {
    log()->error("final snapshot to {} not written: a momentum could not be read from the GPU",
                 config_.snapshot_path);
    return;
  }
  auto entries = std::move(*got);
  if (!entries.empty() && common_step(entries) == -2) {
    if (const int64_t kept = writer_->step_on_disk(config_.snapshot_path); kept != -2) {
      log()->warn("final snapshot skipped: the steps are mixed ({}), a step was cut short; {} "
                  "keeps the snapshot of step {}, one step for every parameter",
                  describe_steps(entries), config_.snapshot_path, kept);
      return;
    }
    log()->warn("final snapshot to {} mixes steps ({}): a step was cut short; a resume from it "
                "is refused unless it adopts each parameter's own step",
                config_.snapshot_path, describe_steps(entries));
  }
  write_snapshot(config_.snapshot_path, entries, NsChoiceTable::process().entries());
  last_snapshot_path_ = config_.snapshot_path;
  last_snapshot_time_ = std::chrono::system_clock::now();
  log()->info("final snapshot of {} parameter(s) written to {}", entries.size(),
              config_.snapshot_path);
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
  request_snapshot(s, path, f.request_id);
}

void Engine::on_state_fetch(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::StateFetch>(f.payload);
  if (auto it = params_.find(m.name); it == params_.end() || !it->second.registered()) {
    if (const Replica* r = replicas_.find(m.name)) {  // a buddy's copy, read back (its tests)
      send_momentum(s, m.name, r->step, r->momentum.data(),
                    static_cast<int64_t>(r->momentum.size()));
      return;
    }
  } else if (fetch_must_wait(it->second, m.after_step)) {
    // Held until the step ends (release_fetches) or, at the latest, the step timeout.
    const uint64_t id = next_fetch_++;
    auto timer = std::make_unique<asio::steady_timer>(io_, config_.step_timeout);
    timer->async_wait([this, id](boost::system::error_code ec) {
      if (ec) return;  // answered before, or the Engine is going
      if (auto h = held_fetches_.find(id); h != held_fetches_.end()) answer_held(h);
    });
    held_fetches_.emplace(id, HeldFetch{s, m.name, m.after_step, f.request_id, std::move(timer)});
    return;
  }
  answer_fetch(s, m.name, f.request_id);
}

bool Engine::fetch_must_wait(const Param& p, int64_t after_step) const {
  const Phase phase = p.phase();
  if (phase == Phase::computing || phase == Phase::replicating) return true;
  return after_step >= 0 && p.last_step() < after_step &&
         (phase == Phase::idle || phase == Phase::gathering);
}

void Engine::answer_fetch(const SessionPtr& s, const std::string& name, uint32_t request_id) {
  Param* pp = nullptr;
  try {
    pp = &registered_param(name, s);
    if (pp->phase() == Phase::computing || pp->phase() == Phase::replicating) {
      throw InvalidArgument("parameter '" + name + "': momentum requested while step " +
                            std::to_string(pp->last_step() + 1) + " is still computing after " +
                            std::to_string(config_.step_timeout.count()) + " ms");
    }
  } catch (const InvalidArgument& e) {
    // Named after the parameter, so that only this fetch fails on the client.
    reply_error(s, {ErrorCode::bad_request, e.message(), name, -1, s->rank}, request_id);
    return;
  }
  pp->role->fetch_momentum(s, name, *pp, request_id);
}

void Engine::release_fetches() {
  for (auto it = held_fetches_.begin(); it != held_fetches_.end();) {
    auto ss = it->second.session.lock();
    auto p = params_.find(it->second.name);
    if (ss && !ss->closed() && p != params_.end() && p->second.registered() &&
        fetch_must_wait(p->second, it->second.after_step)) {
      ++it;
      continue;
    }
    it = answer_held(it);
  }
}

std::map<uint64_t, Engine::HeldFetch>::iterator Engine::answer_held(
    std::map<uint64_t, HeldFetch>::iterator it) {
  auto held = std::move(it->second);
  auto next = held_fetches_.erase(it);
  if (auto ss = held.session.lock(); ss && !ss->closed()) {
    answer_fetch(ss, held.name, held.request_id);
  }
  return next;
}

}  // namespace muon::daemon
