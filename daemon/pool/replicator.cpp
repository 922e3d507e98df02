#include "daemon/pool/replicator.hpp"

#include <utility>

#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

namespace asio = boost::asio;

Replicator::Replicator(ReplicatorConfig config, asio::io_context& io)
    : config_(std::move(config)), io_(io) {
  config_.peers.check("replicator");
}

Replicator::~Replicator() {
  for (auto& [id, link] : links_) link->close();
}

void Replicator::leave() {
  for (auto& [id, link] : links_) link->leave();
}

void Replicator::later(std::function<void()> fn) {
  asio::post(io_, [alive = std::weak_ptr<bool>(alive_), fn = std::move(fn)] {
    if (alive.lock()) fn();
  });
}

void Replicator::mark_down(int target) {
  down_until_[target] = std::chrono::steady_clock::now() + config_.retry_after;
}

std::string Replicator::describe(int id) const {
  return config_.peers.describe(id);
}

std::shared_ptr<PeerLink> Replicator::link_to(int target) {
  auto& link = links_[target];
  if (link && link->alive()) return link;
  const auto& peers = config_.peers;
  PeerLinkConfig c = peers.link_config(
      target, transport::replica_rank(peers.world_size, peers.server_id), /*relay=*/false,
      "muon-offloadd replicating from " + peers.endpoints[static_cast<size_t>(peers.server_id)],
      config_.connect_timeout, config_.op_timeout);
  PeerLinkEvents events;
  events.error = [this, target](const transport::ErrorMsg& e) {
    log()->warn("buddy {} says about the replica of '{}': {}", describe(target), e.param,
                e.message);
  };
  link = PeerLink::open(io_, std::move(c), std::move(events));
  return link;
}

void Replicator::replicate(ReplicaJob job, Done done) {
  const int target = job.target;
  const auto& name = job.seal.name;
  if (!config_.peers.is_peer(target)) {
    later([done, why = "no buddy " + std::to_string(target) + " in a pool of " +
                       std::to_string(config_.peers.endpoints.size()) + " servers"] {
      done(why);
    });
    return;
  }
  if (auto it = down_until_.find(target);
      it != down_until_.end() && std::chrono::steady_clock::now() < it->second) {
    later([done, why = "buddy " + describe(target) + " was unreachable moments ago"] {
      done(why);
    });
    return;
  }
  auto link = link_to(target);
  const int64_t wire_step = job.seal.replica_step + 1;  // a push's step is never negative
  const size_t bytes = static_cast<size_t>(job.numel) * sizeof(float);
  // A push fails only with its link, and then so does the seal below: its answer says it all.
  const auto ignore = [](LinkResult) {};
  link->push(name, wire_step, 0, std::span(reinterpret_cast<const std::byte*>(job.momentum), bytes),
             transport::DType::f32, transport::ChunkKind::replica_momentum, nullptr, ignore);
  if (job.update != nullptr) {
    link->push(name, wire_step, 0, std::span(reinterpret_cast<const std::byte*>(job.update), bytes),
               transport::DType::f32, transport::ChunkKind::replica_update, nullptr, ignore);
  }
  link->register_param(job.seal, [this, target, name, step = job.seal.replica_step,
                                  done = std::move(done)](LinkResult result,
                                                          transport::RegisterOk ok) {
    std::string error;
    if (result) {
      error = "buddy " + describe(target) + ": " + result->message;
    } else if (ok.last_step != step) {
      error = "buddy " + describe(target) + " sealed step " + std::to_string(ok.last_step) +
              " of '" + name + "', not " + std::to_string(step);
    }
    if (error.empty()) {
      down_until_.erase(target);
    } else {
      down_until_[target] = std::chrono::steady_clock::now() + config_.retry_after;
      if (result && result->kind != LinkError::Kind::refused) {
        if (auto it = links_.find(target); it != links_.end()) {
          it->second->abandon(error);
          links_.erase(it);
        }
      }
    }
    done(error);
  });
}

}  // namespace muon::daemon
