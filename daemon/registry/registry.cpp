// Registration: a parameter's registrations from its registrants (every rank, or the plan's
// route), its layout once all have registered, a relayed parameter's registration with its owner,
// re-registration by ranks that reconnected, and a job taking over a parameter another job left.
#include "daemon/engine.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

using transport::ErrorMsg;
using transport::Frame;
using transport::MessageType;

void Engine::on_register(const SessionPtr& s, const Frame& f) {
  const auto m = transport::decode<transport::RegisterParam>(f.payload);
  if (stopping_ && !m.replica) {  // no registration starts (or arms its timer) while stopping
    reply_error(s, {ErrorCode::shutdown, shutdown_why_ + ": registration of '" + m.name + "' refused",
                    m.name, -1, s->rank},
                f.request_id);
    return;
  }
  try {
    register_param(s, f, m);
  } catch (const InvalidArgument& e) {
    // Answered here rather than by the dispatcher's catch, which knows no parameter: the error
    // names it (MuonOffloadError.param in Python, muon_last_error_param in C).
    log()->warn("session {} (rank {}): registration of '{}' refused: {}", s->id(), s->rank,
                m.name, e.message());
    reply_error(s, {ErrorCode::bad_request, e.message(), m.name, -1, s->rank}, f.request_id);
  }
}

void Engine::register_param(const SessionPtr& s, const Frame& f,
                            const transport::RegisterParam& m) {
  if (m.replica) {  // not a registration: an owner seals a replica here (daemon/pool/replicator.hpp)
    on_replica_seal(s, m, f.request_id);
    return;
  }
  ParameterSpec spec;
  spec.name = m.name;
  spec.shape = matrix_shape_from_dims(m.shape, m.name);
  spec.grad_dtype = m.grad_dtype;
  spec.update_dtype = m.update_dtype;
  spec.options = m.options;
  s->job = m.job;
  note_job_session(m.job, /*present=*/true);
  auto it = params_.find(m.name);
  if (it != params_.end() && it->second.registered() &&
      (it->second.job != m.job || it->second.world_size != world_size_)) {
    hand_over(m, s);  // the parameter is registered anew below (or this throws)
    it = params_.end();
  }
  if (it != params_.end() && it->second.registered()) {
    // Re-registration (a client that reconnected): must match what the job registered.
    Param& p = it->second;
    const auto& reg = p.layout->registrants;
    if (!std::binary_search(reg.begin(), reg.end(), s->rank)) {
      throw InvalidArgument("parameter '" + m.name + "' is registered here without " +
                            rank_name(s->rank) + " (registrants " + ranks_text(reg, world_size_) +
                            ")");
    }
    const auto& mine = p.layout->ranks.at(s->rank);
    if (!same_spec(spec, p.layout->spec) || !same_ranges(sorted(m.push), mine.push) ||
        !same_ranges(sorted(m.want), mine.want) || m.packed != mine.packed) {
      throw InvalidArgument("parameter '" + m.name +
                            "' is already registered with another shape, dtype, options or "
                            "ranges (or chunk addressing) for rank " +
                            std::to_string(s->rank));
    }
    // Answer once every rank of the job is connected again, so that nobody pushes a step that
    // needs a rank still restarting.
    p.waiting.emplace_back(s, f.request_id);
    release_reregistrations(p);
    return;
  }
  const bool fresh = it == params_.end();
  Param& p = params_.try_emplace(m.name, m.name, config_.step_timeout).first->second;
  try {
    if (!p.pending) {
      // The plan's route says who registers it here (and whether this server relays it);
      // otherwise every rank of the job.
      const auto route = routes_ ? routes_->route(m.name) : std::nullopt;
      if (route) {
        p.pending.emplace(spec, route->registrants, world_size_);
        p.role = route->relayed ? make_relayed_role(*this, route->owner) : make_owned_role(*this);
      } else {
        p.pending.emplace(spec, world_size_);
        p.role = make_owned_role(*this);
      }
      p.job = m.job;
      p.resume = m.resume;
      p.world_size = world_size_;
      registrants_from_replica(p, spec, s->rank, m);
    } else if (m.job != p.job) {
      throw InvalidArgument("parameter '" + m.name + "': " + rank_name(s->rank) +
                            " registers it for job '" + m.job + "', the ranks before it for job '" +
                            p.job + "': every rank of a job must name the same job");
    }
    bool complete = false;
    try {
      complete = p.pending->add(s->rank, spec, m.push, m.want, m.packed);
      p.refused.erase(s->rank);
    } catch (const InvalidArgument& e) {
      // The rank hears why at once; the ranks that wait for it hear it at the timeout, which
      // would otherwise only name it as missing.
      p.refused[s->rank] = e.message();
      throw;
    }
    p.waiting.emplace_back(s, f.request_id);
    if (complete) {
      complete_registration(m.name, p);
    } else {
      p.steps.registration_started(StepMachine::Clock::now());  // the first one starts it
      if (!p.timer) arm_timer(m.name, p);
    }
  } catch (...) {
    if (fresh && p.waiting.empty()) params_.erase(m.name);
    throw;
  }
}

void Engine::registrants_from_replica(Param& p, const ParameterSpec& spec, int rank,
                                      const transport::RegisterParam& m) {
  // Why not wait for every registrant, as a first registration does: a takeover owes the step
  // in flight to the ranks whose update the lost owner had not sent yet (a relay among them),
  // while a rank that had it registers here only when its next step needs this server, and
  // that rank may first wait, in a collective of the trainer, for a rank the takeover owes.
  const Replica* replica = replicas_.find(spec.name);
  if (replica == nullptr || replica->registrants.empty() || !p.role->keeps_momentum_here()) {
    return;
  }
  ParameterSpec had = spec;
  had.shape = matrix_shape_from_dims(replica->shape, spec.name);
  had.grad_dtype = replica->grad_dtype;
  had.update_dtype = replica->update_dtype;
  had.options = replica->options;
  std::vector<int> ranks, others;
  const transport::RegistrantRanges* mine = nullptr;
  for (const auto& r : replica->registrants) {
    ranks.push_back(r.rank);
    if (r.rank == rank) {
      mine = &r;
    } else {
      others.push_back(r.rank);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  std::sort(others.begin(), others.end());
  // Only the layout the owner had: another one registers the ordinary way, every registrant.
  if (!same_spec(had, spec) || ranks != p.pending->registrants() || mine == nullptr ||
      mine->packed != m.packed || !same_ranges(sorted(mine->push), sorted(m.push)) ||
      !same_ranges(sorted(mine->want), sorted(m.want))) {
    return;
  }
  PendingRegistration filled = *p.pending;
  try {
    for (const auto& r : replica->registrants) {
      if (r.rank != rank) filled.add(r.rank, spec, r.push, r.want, r.packed);
    }
  } catch (const InvalidArgument& e) {
    log()->warn("parameter '{}': the registrants its replica names do not fit ({}); it waits "
                "for every registrant",
                spec.name, e.message());
    return;
  }
  p.pending = std::move(filled);
  // A warning, as the takeover's own: the ranks named registered it with the lost owner only.
  log()->warn("parameter '{}': {} registered it first; ranks {} stand registered as the "
              "replica of server {} names them until they register here",
              spec.name, rank_name(rank), ranks_text(others, world_size_), replica->source);
}

void Engine::hand_over(const transport::RegisterParam& m, const SessionPtr& s) {
  Param& p = params_.at(m.name);
  // The same job at another world size: the server took the new size, so none of the old
  // job's ranks is connected.
  const bool same_job = p.job == m.job;
  for (const auto& [id, w] : sessions_) {
    auto other = w.lock();
    // Compute ranks that registered for that job; a relay's session outlives the jobs it
    // relays for.
    if (same_job || !other || other == s || other->closed() || other->rank < 0 ||
        other->rank >= other->world_size || other->job != p.job) {
      continue;
    }
    throw InvalidArgument("parameter '" + m.name + "' belongs to job '" + p.job + "', whose " +
                          rank_name(other->rank) + " (" + other->client_name +
                          ") is still connected: a second job on this server needs other "
                          "parameter names (prefix=)");
  }
  if (p.phase() != Phase::idle) {
    throw InvalidArgument("parameter '" + m.name + "': a step of job '" + p.job + "' is still " +
                          phase_name(p.phase()) + "; register it again once that finished");
  }
  const bool keep = (same_job || m.resume) && p.role->keeps_momentum_here() && p.last_step() >= 0;
  log()->info("parameter '{}': job '{}' of {} rank(s) registers it after job '{}' of {} left: {}",
              m.name, m.job, world_size_, p.job, p.world_size,
              keep ? "keeping its momentum and step " + std::to_string(p.last_step())
                   : std::string("starting fresh"));
  if (keep) {  // taken over like a restored snapshot's entry: any world size and layout
    restored_[m.name] = SnapshotEntry{m.name, dims_of(p.layout->spec.shape), p.last_step(),
                                      p.layout->spec.options, host_momentum_now(p)};
  } else {
    restored_.erase(m.name);
  }
  if (p.timer) p.timer->cancel();
  params_.erase(m.name);
}

void Engine::complete_registration(const std::string& name, Param& p) {
  auto waiting = std::move(p.waiting);
  p.waiting.clear();
  if (p.timer) p.timer->cancel();
  p.timer.reset();
  try {
    p.layout.emplace(p.pending->finish(/*partial=*/!p.role->keeps_momentum_here()));
  } catch (const InvalidArgument& e) {
    metrics_.error(ErrorCode::bad_request);
    for (auto& [w, req] : waiting) {
      if (auto ws = w.lock())
        ws->send_error({ErrorCode::bad_request, e.message(), name, -1, -1}, req);
    }
    params_.erase(name);
    return;
  }
  p.pending.reset();
  p.waiting = std::move(waiting);
  // auto's choices for its block shapes now, on the worker, before its first gradient arrives.
  if (p.role->keeps_momentum_here()) {
    scheduler_.prepare(name, p.layout->spec.shape, p.layout->spec.options);
  }
  p.role->registered(name, p);
}

void Engine::answer_registration(Param& p) {
  transport::RegisterOk ok{p.layout->spec.name, p.layout->contributors, p.last_step()};
  auto waiting = std::move(p.waiting);
  p.waiting.clear();
  for (auto& [w, req] : waiting) {
    auto ws = w.lock();
    if (!ws) continue;
    ok.param_id = ws->param_id(ok.name);  // the session's chunks name the parameter by it
    ws->send(MessageType::register_ok, transport::encode(ok), req);
  }
}

void Engine::release_reregistrations(Param& p) {
  if (p.phase() == Phase::awaiting_owner || p.awaiting_buddy)
    return;  // the owner (the buddy) answers first
  for (int r : p.layout->registrants) {
    if (!session_of(r)) return;
  }
  answer_registration(p);
}

Engine::Param& Engine::registered_param(const std::string& name, const SessionPtr& s) {
  auto it = params_.find(name);
  if (it == params_.end() || !it->second.registered()) {
    throw InvalidArgument("unknown parameter '" + name + "' (not registered by every rank)");
  }
  const auto& reg = it->second.layout->registrants;
  if (!std::binary_search(reg.begin(), reg.end(), s->rank)) {
    throw InvalidArgument(rank_name(s->rank) + " is not part of parameter '" + name +
                          "' on this server (registrants " + ranks_text(reg, world_size_) + ")");
  }
  return it->second;
}

}  // namespace muon::daemon
