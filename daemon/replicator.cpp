#include "daemon/replicator.hpp"

#include <utility>

#include "client/client_error.hpp"
#include "client/connection.hpp"
#include "core/error.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

Replicator::Replicator(ReplicatorConfig config, Post post)
    : config_(std::move(config)), post_(std::move(post)) {
  if (config_.server_id < 0 || config_.server_id >= static_cast<int>(config_.pool.size())) {
    throw InvalidArgument("replicator: server id " + std::to_string(config_.server_id) +
                          " is not in the pool of " + std::to_string(config_.pool.size()) +
                          " servers");
  }
  thread_ = std::thread([this] {
    for (;;) {
      std::pair<ReplicaJob, Done> next;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        next = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::string error = run(next.first);
      post_([done = std::move(next.second), error = std::move(error)] { done(error); });
    }
  });
}

Replicator::~Replicator() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& [id, c] : connections_) {
      if (c) c->abandon("the server is shutting down");
    }
  }
  cv_.notify_all();
  thread_.join();
  std::map<int, std::shared_ptr<client::Connection>> connections;
  {
    std::lock_guard lk(mu_);
    connections.swap(connections_);
  }
  connections.clear();
}

void Replicator::replicate(ReplicaJob job, Done done) {
  {
    std::lock_guard lk(mu_);
    jobs_.emplace_back(std::move(job), std::move(done));
  }
  cv_.notify_one();
}

void Replicator::mark_down(int target) {
  std::lock_guard lk(mu_);
  down_until_[target] = std::chrono::steady_clock::now() + config_.retry_after;
}

std::string Replicator::describe(int id) const {
  const bool known = id >= 0 && id < static_cast<int>(config_.pool.size());
  return "server " + std::to_string(id) +
         (known ? " (" + config_.pool[static_cast<size_t>(id)] + ")" : std::string());
}

std::shared_ptr<client::Connection> Replicator::connection(int target) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw client::ConnectionLost("the server is shutting down");
    auto& c = connections_[target];
    if (c && c->lost_reason().empty()) return c;
    c.reset();
  }
  const std::string& endpoint = config_.pool[static_cast<size_t>(target)];
  const bool tcp = transport::parse_endpoint(endpoint).is_tcp();
  auto fresh = std::make_shared<client::Connection>(
      endpoint, transport::replica_rank(config_.world_size, config_.server_id),
      config_.world_size,
      "muon-offloadd replicating from " + config_.pool[static_cast<size_t>(config_.server_id)],
      config_.connect_timeout, config_.op_timeout, tcp ? config_.remote_plane : config_.local_plane,
      config_.auth_token, /*relay_server=*/-1, /*replica_server=*/config_.server_id);
  std::lock_guard lk(mu_);
  if (stopping_) fresh->abandon("the server is shutting down");
  connections_[target] = fresh;
  return fresh;
}

std::string Replicator::run(const ReplicaJob& job) {
  const int target = job.target;
  const auto& name = job.seal.name;
  if (target < 0 || target >= static_cast<int>(config_.pool.size()) ||
      target == config_.server_id) {
    return "no buddy " + std::to_string(target) + " in a pool of " +
           std::to_string(config_.pool.size()) + " servers";
  }
  {
    std::lock_guard lk(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (auto it = down_until_.find(target); it != down_until_.end() && now < it->second) {
      return "buddy " + describe(target) + " was unreachable moments ago";
    }
  }
  try {
    auto conn = connection(target);
    const int64_t wire_step = job.seal.replica_step + 1;  // a push's step is never negative
    conn->push(name, wire_step, 0, reinterpret_cast<const std::byte*>(job.momentum), job.numel, 4,
               transport::ChunkKind::replica_momentum);
    if (job.update != nullptr) {
      conn->push(name, wire_step, 0, reinterpret_cast<const std::byte*>(job.update), job.numel, 4,
                 transport::ChunkKind::replica_update);
    }
    const auto ok = conn->wait_register(conn->send_register(job.seal), name);
    if (ok.last_step != job.seal.replica_step) {
      return "buddy " + describe(target) + " sealed step " + std::to_string(ok.last_step) +
             " of '" + name + "', not " + std::to_string(job.seal.replica_step);
    }
    std::lock_guard lk(mu_);
    down_until_.erase(target);
    return "";
  } catch (const std::exception& e) {
    std::shared_ptr<client::Connection> dead;  // destroyed outside the lock (it joins a thread)
    {
      std::lock_guard lk(mu_);
      down_until_[target] = std::chrono::steady_clock::now() + config_.retry_after;
      if (auto it = connections_.find(target); it != connections_.end()) {
        dead = std::move(it->second);
        connections_.erase(it);
      }
    }
    return "buddy " + describe(target) + ": " + e.what();
  }
}

}  // namespace muon::daemon
