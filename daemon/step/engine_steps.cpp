// The Engine's side of the step machine (step/step_machine.hpp): the open step and its
// deadline, the hand-off through the parameter's role (step/parameter_role.hpp), the results
// coming back, lost ranks and dropped steps.
#include "daemon/engine.hpp"

#include <algorithm>
#include <chrono>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::ErrorMsg;
using transport::MessageType;

void Engine::check_gradient_step(const transport::Push& m, const Param& p) const {
  p.steps.check_step(m.step);
}

StepReducer* Engine::start_gathering(const SessionPtr& s, const transport::Push& m, Param& p) {
  if (auto* open = p.steps.gathering()) return open;
  // Stopping: the steps being computed finish, no step starts (shutdown() dropped the open ones).
  if (stopping_) {
    reply_error(s, {ErrorCode::shutdown,
                    shutdown_why_ + ": step " + std::to_string(m.step) + " of '" + m.name +
                        "' not started, momentum untouched",
                    m.name, m.step, s->rank});
    return nullptr;
  }
  // A step that needs a lost rank can never complete: say so now, not at the timeout.
  for (const auto& [lost, what] : lost_ranks_) {
    if (contributes(*p.layout, lost)) {
      reply_error(s, {ErrorCode::peer_lost,
                      what + "; step " + std::to_string(m.step) + " of '" + m.name +
                          "' cannot complete until it reconnects",
                      m.name, m.step, lost});
      return nullptr;
    }
  }
  const auto now = StepMachine::Clock::now();
  // The taken-over step stays replayable while the step after it gathers: a rank connected
  // straight to the lost owner may still push it again while another rank, which had its
  // update, opens the next one. A step two later opens only once every rank has pushed the one
  // between: the replayed step is behind every rank then.
  if (p.replay && p.replay->step < m.step - 1) p.replay.reset();
  StepReducer& reducer = p.steps.open(m.step, *p.layout, now, [&] {
    return p.storage->make_contribution_store();
  });
  p.step_started = now;
  arm_timer(m.name, p);
  return &reducer;
}

void Engine::start_compute(const std::string& name, Param& p) {
  if (p.timer) p.timer->cancel();
  p.timer.reset();
  p.role->hand_off(name, p, *p.steps.gathering());
}

void Engine::finish_relayed(RelayStep step) {
  auto it = params_.find(step.name);
  if (it == params_.end() || !it->second.registered()) return;
  Param& p = it->second;
  if (step.resync) {  // registered again with an owner that restarted
    if (p.last_step() != step.step) {
      log()->warn("parameter '{}': registered again with server {} (its owner restarted, or "
                  "its buddy took it over) at last applied step {} (this relay had {})",
                  step.name, step.owner, step.step, p.last_step());
    }
    p.steps.record_step(step.step);
    return;
  }
  // The owner consumed a refused step (non-finite, backend) as its own; a dropped one (a lost
  // peer, a timeout) may be pushed again.
  const bool consumed = !step.error || step.error->code == ErrorCode::non_finite ||
                        step.error->code == ErrorCode::backend;
  if (!step.unasked) {  // the answer to this relay's forward
    p.steps.finish(step.step, consumed);
    p.grad = std::move(step.grad);
  } else if (consumed) {
    p.steps.record_step(step.step);
  }
  if (step.error) {
    log()->warn("parameter '{}' step {}: {}", step.name, step.step, step.error->message);
    metrics_.error(step.error->code);
    metrics_.step_done("refused");
    broadcast(p, *step.error);
    after_steps();
    return;
  }
  NsJob job;
  job.name = step.name;
  job.step = step.step;
  job.shape = p.layout->spec.shape;
  job.applied = step.applied;
  job.update = std::move(step.update);
  // On the GPU data plane the owner's update goes into the device buffer first, as if computed.
  if (!step.want.empty()) return_update(p, job, /*upload=*/true);
  metrics_.step_done(job.applied ? "applied" : "skipped");
  if (!step.unasked) metrics_.step_latency(job.shape, seconds_since(p.step_started));
  p.update = std::move(job.update);
  after_steps();
}

void Engine::finish_jobs(std::vector<NsJob> jobs) {
  for (auto& job : jobs) {
    auto it = params_.find(job.name);
    if (it == params_.end()) continue;
    Param& p = it->second;
    const int target = replica_target(job.name);
    // applied, skipped or refused; with a buddy, held back until the buddy holds it
    p.steps.finish(job.step, /*consumed=*/true, /*replicate=*/target >= 0);
    collect_periodic(job.name, p);
    if (target < 0) {
      release_step(p, job);
      continue;
    }
    auto held = std::make_shared<NsJob>(std::move(job));
    const bool refused = !held->error.empty();
    // A refused step's outcome on the wire is its code's name (ReplicaStore::seal).
    const std::string outcome = refused         ? std::string(error_code_name(held->error_code))
                                : held->applied ? "applied"
                                                : "skipped";
    auto release = [this, held](Param& q) {
      q.steps.replicated();
      release_step(q, *held);
      after_steps();
    };
    if (refused) {
      replicate_then(held->name, p, target, held->step, outcome, nullptr, std::move(release));
      continue;
    }
    // The update goes to the buddy from host memory (held->update; read back on the GPU data
    // plane, without the io thread waiting).
    Param* param = &p;  // lives while its storage does, which runs the continuation only then
    p.storage->read_update(*held, [this, held, param, target, outcome, release](
                                      const float* values, std::exception_ptr error) mutable {
      if (error) {
        note_buddy(target, "the update of '" + held->name + "' could not be read from the GPU");
        release(*param);
        return;
      }
      const size_t n = static_cast<size_t>(held->shape.numel());
      if (values != held->update.data()) held->update.assign(values, values + n);
      replicate_then(held->name, *param, target, held->step, outcome, held->update.data(),
                     std::move(release));
    });
  }
  after_steps();
}

void Engine::release_step(Param& p, NsJob& job) {
  if (!job.error.empty()) {
    log()->warn("parameter '{}' step {}: {}", job.name, job.step, job.error);
    metrics_.error(job.error_code);
    metrics_.step_done("refused");
    broadcast(p, {job.error_code, job.error, job.name, job.step, -1});
    p.grad = std::move(job.grad);
    return;
  }
  return_update(p, job, /*upload=*/false);
  metrics_.step_done(job.applied ? "applied" : "skipped");
  if (job.applied) metrics_.newton_schulz(job.shape, job.compute_seconds);
  metrics_.step_latency(job.shape, seconds_since(p.step_started));
  if (job.health) observe_health(job.name, p, job);
  p.grad = std::move(job.grad);
  p.update = std::move(job.update);
}

void Engine::after_steps() {
  release_fetches();
  if (!any_computing()) {
    auto waiters = std::move(snapshot_waiters_);
    snapshot_waiters_.clear();
    for (auto& [w, req] : waiters) {
      if (auto ws = w.lock()) request_snapshot(ws, req.first, req.second);
    }
    maybe_finish_shutdown();
  }
}

void Engine::arm_timer(const std::string& name, Param& p) {
  if (!p.steps.deadline()) return;
  p.timer = std::make_unique<asio::steady_timer>(io_, *p.steps.deadline());
  p.timer->async_wait([this, name](boost::system::error_code ec) {
    if (ec) return;  // cancelled
    auto it = params_.find(name);
    if (it == params_.end()) return;
    Param& q = it->second;
    const auto now = StepMachine::Clock::now();
    const auto ms = std::to_string(q.steps.timeout().count());
    if (q.steps.expire_registration(now)) {
      const auto missing = q.pending->missing_ranks();
      std::string msg = "registration of '" + name + "' incomplete after " + ms + " ms: ranks " +
                        ranks_text(missing, world_size_) + " have not registered it";
      for (const auto& [rank, why] : q.refused) {
        msg += "; " + rank_name(rank) + "'s registration was refused: " + why;
      }
      log()->warn("{}", msg);
      metrics_.error(ErrorCode::timeout);
      for (auto& [w, req] : q.waiting) {
        if (auto ws = w.lock()) ws->send_error({ErrorCode::timeout, msg, name, -1, -1}, req);
      }
      return;
    }
    if (const auto dropped = q.steps.expire_step(now)) {
      const auto& missing = dropped->missing;
      report_dropped(
          q,
          {ErrorCode::timeout,
           "parameter '" + name + "' step " + std::to_string(dropped->step) + ": ranks " +
               ranks_text(missing, world_size_) + " did not commit within " + ms +
               " ms; partial step dropped, momentum untouched",
           name, dropped->step, missing.empty() ? -1 : missing.front()},
          -1);
    }
  });
}

void Engine::report_dropped(Param& p, const ErrorMsg& error, int except_rank) {
  log()->warn("{}", error.message);
  metrics_.error(error.code);
  if (p.timer) p.timer->cancel();
  p.timer.reset();
  broadcast(p, error, except_rank);
  release_fetches();  // a fetch waiting for the dropped step gets what the server holds
}

void Engine::tell_lost(const SessionPtr& lost, const std::string& what) {
  const std::string msg = what + "; reported to every rank of the job at once: the job cannot "
                          "take another step until it reconnects";
  log()->warn("{}", msg);
  for (const auto& [rank, w] : ranks_) {
    auto s = w.lock();
    if (!s || s == lost || s->closed() || rank >= world_size_ || s->job != lost->job) continue;
    s->send_error({ErrorCode::peer_lost, msg, "", -1, lost->rank});
  }
}

void Engine::on_closed(const SessionPtr& s, const std::string& why) {
  sessions_.erase(s->id());
  if (s->job) note_job_session(*s->job, /*present=*/false);
  reports_.erase(s->id());
  const int rank = s->rank;
  if (rank >= 0) {
    auto it = ranks_.find(rank);
    if (it != ranks_.end() && it->second.lock() == s) ranks_.erase(it);
  }
  log()->info("session {} ({}) closed: {}", s->id(), rank_name(rank), why);
  // An owner's replica session carries no step: its loss is the owner's, which its ranks see.
  // A lost one is this server's buddy gone too (after a takeover it replicates to that owner):
  // no replication waits for its connect timeout.
  if (is_replica_session(*s)) {
    if (why != "goodbye" && !stopping_ && routes_ &&
        static_cast<int>(config_.pool_servers.size()) == routes_->servers()) {
      replicator().mark_down(s->rank - s->world_size - transport::kMaxRelayServers);
    }
    return;
  }
  // A relay server says goodbye only when it stops (Relay::leave, at its shutdown): unlike a
  // compute rank at the end of its job, it is not coming back by itself, and a step that needs
  // its partial sum is refused at once, naming it, until it reconnects (not at the timeout).
  const bool relay = s->world_size > 0 && rank >= s->world_size;
  const std::string gone = why != "goodbye" ? "was lost (" + why + ")"
                           : relay          ? "shut down (it said goodbye)"
                                            : "left (goodbye)";
  if (rank >= 0 && (why != "goodbye" || relay) && !stopping_) {
    lost_ranks_[rank] = rank_name(rank) + " (" + s->client_name + ") " + gone;
    if (why != "goodbye") tell_lost(s, lost_ranks_[rank]);
  }
  for (auto& [name, p] : params_) {
    std::erase_if(p.waiting, [&](const auto& w) {
      auto ws = w.first.lock();
      return !ws || ws == s;
    });
    if (rank < 0 || stopping_) continue;
    const auto dropped = p.steps.lose(rank);
    if (!dropped) continue;
    const int64_t step = dropped->step;
    report_dropped(
        p,
        {ErrorCode::peer_lost,
         rank_name(rank) + " (" + s->client_name + ") " + gone + " during step " +
             std::to_string(step) + " of '" + name + "'; partial step dropped, momentum untouched",
         name, step, rank},
        rank);
  }
  if (rank < 0 || stopping_) return;
  // A registration that nobody waits for any more: every rank that registered it left.
  std::erase_if(params_, [](auto& kv) {
    auto& p = kv.second;
    const bool void_registration = p.phase() == Phase::registering && p.waiting.empty();
    if (void_registration && p.timer) p.timer->cancel();
    return void_registration;
  });
  // The job is over once none of its compute ranks is connected: the next job may have another
  // world size (its registrations then take the parameters over: Engine::hand_over).
  const bool a_rank_remains = std::any_of(ranks_.begin(), ranks_.end(), [&](const auto& kv) {
    return kv.first < world_size_ && !kv.second.expired();
  });
  if (world_size_ != 0 && !a_rank_remains && !routes_) {
    log()->info("every rank of the job of {} has left: a job of any size may connect", world_size_);
    world_size_ = 0;
    lost_ranks_.clear();
  }
}

}  // namespace muon::daemon
