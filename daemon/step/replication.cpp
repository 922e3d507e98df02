// The Engine's side of replication (daemon/pool/replicator.hpp, daemon/replica_store.hpp): an owned
// step held back until the buddy holds its state, the buddy's store of replica sessions' chunks
// and seals, and a taken-over parameter's replayed step.
#include <algorithm>

#include "core/error.hpp"
#include "daemon/engine.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

using transport::ErrorMsg;
using transport::MessageType;

int Engine::replica_target(const std::string& name) const {
  if (!config_.replicate || !routes_ ||
      static_cast<int>(config_.pool_servers.size()) != routes_->servers()) {
    return -1;
  }
  const int owner = routes_->owner_of(name);
  const int buddy = routes_->buddy_of(owner);
  if (owner < 0 || buddy < 0) return -1;
  if (config_.server_id == owner) return buddy;
  if (config_.server_id == buddy) return owner;  // took it over: the owner, restarted, is its buddy
  return -1;
}

void Engine::replicate_then(const std::string& name, Param& p, int target, int64_t step,
                            const std::string& outcome, const float* update,
                            std::function<void(Param&)> release) {
  // The momentum first comes to the host (on the GPU data plane without the io thread waiting);
  // a failed read holds nothing back: the step goes out unreplicated, as with a buddy down.
  with_host_momentum(name, p, [this, name, target, step, outcome, update,
                               release = std::move(release)](Param& q, bool fresh) mutable {
    if (!fresh) {
      note_buddy(target, "the momentum of '" + name + "' could not be read from the GPU");
      release(q);
      return;
    }
    const auto& spec = q.layout->spec;
    ReplicaJob job;
    job.target = target;
    job.seal.name = name;
    job.seal.shape = dims_of(spec.shape);
    job.seal.grad_dtype = spec.grad_dtype;
    job.seal.update_dtype = spec.update_dtype;
    job.seal.options = spec.options;
    job.seal.replica = true;
    job.seal.replica_step = step;
    job.seal.replica_outcome = outcome;
    for (int r : q.layout->registrants) {
      const auto& ranges = q.layout->ranks.at(static_cast<size_t>(r));
      job.seal.replica_registrants.push_back({r, ranges.push, ranges.want, ranges.packed});
    }
    job.momentum = q.momentum.data();
    job.update = update;
    job.numel = spec.shape.numel();
    replicator().replicate(
        std::move(job), [this, name, target, release = std::move(release)](std::string error) {
          note_buddy(target, error);
          auto it = params_.find(name);
          if (it == params_.end()) return;
          release(it->second);
        });
  });
}

void Engine::note_buddy(int target, const std::string& error) {
  bool& down = buddy_down_[target];
  if (!error.empty() && !down) {
    log()->warn("replication to buddy {} failed ({}): its parameters' updates go out "
                "unreplicated until it answers again, so a crash of this server now loses {}",
                replicator().describe(target), error,
                config_.snapshot_every > 0
                    ? "the steps since its last snapshot (at most " +
                          std::to_string(config_.snapshot_every) + ")"
                    : std::string("their momentum (no --snapshot-every)"));
    metrics_.error(ErrorCode::peer_lost);
  } else if (error.empty() && down) {
    log()->warn("buddy {} holds this server's replicas again", replicator().describe(target));
  }
  down = !error.empty();
}

bool Engine::is_replica_session(const Session& s) const {
  return s.world_size > 0 && s.rank >= s.world_size + transport::kMaxRelayServers;
}

void Engine::on_replica_push(const SessionPtr& s, const transport::Push& m,
                             std::span<const float> values) {
  if (!is_replica_session(*s)) {
    throw InvalidArgument("a chunk of kind " + std::string(m.kind == transport::ChunkKind::
                                                               replica_momentum
                                                               ? "replica_momentum"
                                                               : "replica_update") +
                          " from " + rank_name(s->rank) + ": only an owner's replica session "
                          "sends them");
  }
  const int source = s->rank - s->world_size - transport::kMaxRelayServers;
  replicas_.stage(m.name, source, m.kind, m.step - 1, m.offset, values);  // wire step = step + 1
  metrics_.chunk_received(m.kind, values.size_bytes());
}

void Engine::on_replica_seal(const SessionPtr& s, const transport::RegisterParam& m,
                             uint32_t request_id) {
  if (!is_replica_session(*s)) {
    throw InvalidArgument("a replica seal of '" + m.name + "' from " + rank_name(s->rank) +
                          ": only an owner's replica session sends them");
  }
  if (auto it = params_.find(m.name); it != params_.end() && it->second.registered() &&
                                      it->second.role->keeps_momentum_here()) {
    throw InvalidArgument("a replica of '" + m.name + "' sent to a server that owns it (two "
                          "owners of one parameter: the pool's owner and its buddy disagree)");
  }
  const int source = s->rank - s->world_size - transport::kMaxRelayServers;
  replicas_.seal(m, source);
  s->send(MessageType::register_ok,
          transport::encode(transport::RegisterOk{m.name, 0, m.replica_step}), request_id);
}

bool Engine::replaying(const Param& p, int64_t step) const {
  return p.replay && p.replay->step == step;
}

void Engine::send_replay(const std::string& name, Param& p, const SessionPtr& s) {
  const Replica& r = *p.replay;
  if (r.update.empty()) {  // a refused step: its error again
    // The outcome of a refused step is its code's name (as finish_jobs sealed it).
    s->send_error({error_code_from_name(r.outcome).value_or(ErrorCode::internal),
                   "parameter '" + name + "' step " + std::to_string(r.step) +
                       " was refused by its owner (server " + std::to_string(r.source) +
                       ") before it was lost (" + r.outcome + "); the step is consumed",
                   name, r.step, -1});
    return;
  }
  NsJob job;
  job.name = name;
  job.step = r.step;
  job.shape = p.layout->spec.shape;
  job.applied = r.outcome == "applied";
  job.update = r.update;
  return_update(p, job, /*upload=*/true, s->rank);
  log()->info("parameter '{}' step {}: {} pushed it again after its owner was lost; answered "
              "with the update the owner computed (replica)",
              name, r.step, rank_name(s->rank));
}

}  // namespace muon::daemon
