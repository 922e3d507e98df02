#include "daemon/relay.hpp"

#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "client/client_error.hpp"
#include "client/connection.hpp"
#include "core/error.hpp"
#include "daemon/log.hpp"
#include "kernels/bf16.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

using transport::DType;
using transport::ErrorMsg;

void Relay::Queue::push(Task t) {
  {
    std::lock_guard lk(mu);
    tasks.push_back(std::move(t));
  }
  cv.notify_one();
}

void Relay::Queue::run() {
  for (;;) {
    Task t;
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return stopping || !tasks.empty(); });
      if (tasks.empty()) return;
      t = std::move(tasks.front());
      tasks.pop_front();
    }
    t();
  }
}

Relay::Relay(RelayConfig config, Post post) : config_(std::move(config)), post_(std::move(post)) {
  if (config_.server_id < 0 || config_.server_id >= static_cast<int>(config_.pool.size())) {
    throw InvalidArgument("relay: server id " + std::to_string(config_.server_id) +
                          " is not in the pool of " + std::to_string(config_.pool.size()) +
                          " servers");
  }
  sender_thread_ = std::thread([this] { sender_.run(); });
}

Relay::~Relay() {
  stopping_ = true;
  {
    std::lock_guard lk(connections_mu_);
    for (auto& [id, c] : connections_) {
      if (c) c->abandon("the relay server is shutting down");
    }
  }
  {
    std::lock_guard lk(sender_.mu);
    sender_.stopping = true;
  }
  sender_.cv.notify_all();
  sender_thread_.join();  // every wait it queued is in a waiter now
  std::vector<std::thread> threads;
  {
    std::lock_guard lk(waiters_mu_);
    waiters_stopping_ = true;
    for (auto& [owner, w] : waiters_) {
      {
        std::lock_guard qlk(w->queue.mu);
        w->queue.stopping = true;
      }
      w->queue.cv.notify_all();
      if (w->thread.joinable()) threads.push_back(std::move(w->thread));
    }
  }
  for (auto& t : threads) t.join();
  // The connections go first (their readers may still call back into the queues and the
  // subscriptions while they finish), outside the lock their callbacks never take.
  std::map<int, std::shared_ptr<client::Connection>> connections;
  {
    std::lock_guard lk(connections_mu_);
    connections.swap(connections_);
  }
  connections.clear();
}

Relay::Queue& Relay::waiter(int owner) {
  std::lock_guard lk(waiters_mu_);
  auto& w = waiters_[owner];
  if (!w) {
    w = std::make_unique<Waiter>();
    // Once ~Relay stopped the waiters, a late callback's task is queued and never run.
    if (!waiters_stopping_) w->thread = std::thread([q = &w->queue] { q->run(); });
  }
  return w->queue;
}

std::string Relay::describe(int id) const {
  const bool known = id >= 0 && id < static_cast<int>(config_.pool.size());
  return "server " + std::to_string(id) +
         (known ? " (" + config_.pool[static_cast<size_t>(id)] + ")" : std::string());
}

ErrorMsg Relay::error_of(const std::exception& e, int owner, const std::string& name,
                         int64_t step) const {
  if (const auto* se = dynamic_cast<const client::ServerError*>(&e)) {
    return {se->code, "owner " + describe(owner) + ": " + se->message(), name, step, -1};
  }
  const auto* me = dynamic_cast<const Error*>(&e);
  const std::string what = me ? me->message() : e.what();
  const ErrorCode code =
      dynamic_cast<const client::Timeout*>(&e) ? ErrorCode::timeout : ErrorCode::peer_lost;
  return {code,
          "relay " + describe(config_.server_id) + " cannot reach owner " + describe(owner) +
              " of '" + name + "': " + what,
          name, step, -1};
}

ErrorMsg Relay::forward_error(const std::exception& e, int server, const RelayStep& step) {
  ErrorMsg err = error_of(e, server, step.name, step.step);
  if (dynamic_cast<const client::ConnectionLost*>(&e) == nullptr) return err;
  std::vector<int> lost{step.owner};
  const int buddy = step.owner >= 0 && step.owner < static_cast<int>(config_.buddies.size())
                        ? config_.buddies[static_cast<size_t>(step.owner)]
                        : -1;
  if (step.failovers > 0 && buddy >= 0) lost.push_back(buddy);
  auto servers = nlohmann::json::array();
  {
    std::lock_guard lk(targets_mu_);
    for (int id : lost) {
      const std::string& endpoint = config_.pool[static_cast<size_t>(id)];
      const auto it = snapshots_.find(id);
      if (it == snapshots_.end()) servers.push_back({endpoint});  // never said (no hello)
      else servers.push_back({endpoint, it->second.first, it->second.second});
    }
  }
  err.message += "\nsnapshots of the lost servers (JSON): " +
                 servers.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return err;
}

int Relay::target_of(int owner) {
  std::lock_guard lk(targets_mu_);
  const auto it = targets_.find(owner);
  return it == targets_.end() ? owner : it->second;
}

bool Relay::fail_over(int owner, int from, const std::string& why) {
  const int buddy = owner >= 0 && owner < static_cast<int>(config_.buddies.size())
                        ? config_.buddies[static_cast<size_t>(owner)]
                        : -1;
  if (buddy < 0) return false;
  int next = -1;
  {
    std::lock_guard lk(targets_mu_);
    const auto it = targets_.find(owner);
    const int current = it == targets_.end() ? owner : it->second;
    if (current != from) return true;  // another task failed it over already
    next = from == owner ? buddy : owner;
    targets_[owner] = next;
    moved_[next].insert(owner);
  }
  // The lost connection goes now: when the parameters come back to `from` (restarted), a new
  // session is made; a stale lost one must not send them away again (resolve).
  std::shared_ptr<client::Connection> dead;  // released outside the lock (it joins a thread)
  {
    std::lock_guard lk(connections_mu_);
    const auto it = connections_.find(from);
    if (it != connections_.end()) {
      if (it->second) it->second->abandon("lost: " + why);
      lost_.insert(from);
      dead = std::move(it->second);
      connections_.erase(it);
    }
  }
  log()->warn("relay {}: {} was lost ({}); the parameters of owner {} go to {} from now on, "
              "which holds their replica; steps in flight are pushed there again",
              describe(config_.server_id), describe(from), why, describe(owner), describe(next));
  return true;
}

int Relay::resolve(int owner) {
  const int t = target_of(owner);
  std::string why;
  {
    std::lock_guard lk(connections_mu_);
    const auto it = connections_.find(t);
    if (it != connections_.end() && it->second) why = it->second->lost_reason();
  }
  if (!why.empty() && fail_over(owner, t, why)) return target_of(owner);
  return t;
}

void Relay::register_all(int server, client::Connection& conn, const std::vector<int>& owners) {
  std::vector<std::pair<uint32_t, std::string>> sent;
  for (int o : owners) {
    for (const auto& reg : registered_[o]) {
      conn.expect_updates(reg.name, reg.want, transport::dtype_bytes(reg.update_dtype));
      sent.emplace_back(conn.send_register(reg), reg.name);
    }
  }
  for (const auto& [id, name] : sent) {
    const auto ok = conn.wait_register(id, name);
    RelayStep st;
    std::function<void(RelayStep)> deliver;
    {
      std::lock_guard lk(subscriptions_mu_);
      const auto it = subscriptions_.find(name);
      if (it == subscriptions_.end()) continue;
      st = it->second.prototype;
      deliver = it->second.deliver;
    }
    st.step = ok.last_step;
    st.resync = true;
    st.owner = server;
    post_([deliver, st = std::move(st)]() mutable { deliver(std::move(st)); });
  }
}

std::shared_ptr<client::Connection> Relay::connection(int server) {
  return connection(server, config_.connect_timeout);
}

std::shared_ptr<client::Connection> Relay::connection(int server,
                                                      std::chrono::milliseconds connect_timeout) {
  if (server < 0 || server >= static_cast<int>(config_.pool.size()) ||
      server == config_.server_id) {
    throw InvalidArgument("relay: no owner " + std::to_string(server) + " in a pool of " +
                          std::to_string(config_.pool.size()) + " servers (this one is " +
                          std::to_string(config_.server_id) + ")");
  }
  std::shared_ptr<client::Connection> alive;
  {
    std::lock_guard lk(connections_mu_);
    auto& c = connections_[server];
    if (c && c->lost_reason().empty()) alive = c;
    else if (c) lost_.insert(server);
    if (!alive) c.reset();
  }
  // The owners whose parameters go to `server`: all of them on a new session (the server
  // restarted, or the connection broke), those failed over to it since on an existing one.
  std::vector<int> owners;
  {
    std::lock_guard lk(targets_mu_);
    auto moved = std::move(moved_[server]);
    moved_.erase(server);
    if (alive) {
      owners.assign(moved.begin(), moved.end());
    } else {
      for (const auto& [o, regs] : registered_) {
        const auto it = targets_.find(o);
        if ((it == targets_.end() ? o : it->second) == server) owners.push_back(o);
      }
    }
  }
  if (alive) {
    try {
      register_all(server, *alive, owners);
    } catch (...) {
      std::lock_guard lk(targets_mu_);
      moved_[server].insert(owners.begin(), owners.end());  // the next connection registers them
      throw;
    }
    return alive;
  }
  if (stopping_) throw client::ConnectionLost("the relay server is shutting down");
  const std::string& endpoint = config_.pool[static_cast<size_t>(server)];
  const bool tcp = transport::parse_endpoint(endpoint).is_tcp();
  auto fresh = std::make_shared<client::Connection>(
      endpoint, transport::relay_rank(config_.world_size, config_.server_id), config_.world_size,
      "muon-offloadd at " + config_.pool[static_cast<size_t>(config_.server_id)],
      connect_timeout, config_.op_timeout, tcp ? config_.remote_plane : config_.local_plane,
      config_.auth_token, config_.server_id);
  {
    std::lock_guard lk(connections_mu_);
    lost_.erase(server);
  }
  if (auto said = fresh->snapshot_config()) {
    std::lock_guard lk(targets_mu_);
    snapshots_[server] = std::move(*said);
  }
  // Callbacks first (the owner sends unasked updates as soon as a registration is whole again),
  // and in the map before any wait, so that ~Relay can abandon it.
  watch(fresh, server);
  {
    std::lock_guard lk(connections_mu_);
    if (stopping_) fresh->abandon("the relay server is shutting down");
    connections_[server] = fresh;
  }
  // Register everything again, and tell each parameter the server's last applied step (a
  // restart from a snapshot, or a buddy's replica).
  try {
    register_all(server, *fresh, owners);
  } catch (...) {
    std::lock_guard lk(connections_mu_);
    if (connections_[server] == fresh) connections_[server].reset();
    throw;
  }
  return fresh;
}

std::shared_ptr<client::Connection> Relay::step_connection(int server, const RelayStep& step) {
  const auto it = refused_.find(server);
  if (it != refused_.end() && it->second.first == step.step) {
    throw client::ConnectionLost(it->second.second);
  }
  // A failover's target was running when the step went there: refused, it is lost too. So is
  // a lost owner that has a buddy: the step goes there rather than wait for a restart.
  const bool failed_over = step.failovers > 0 || server != step.owner;
  bool lost_with_buddy = false;
  {
    std::lock_guard lk(connections_mu_);
    lost_with_buddy = lost_.count(server) != 0 && step.owner >= 0 &&
                      step.owner < static_cast<int>(config_.buddies.size()) &&
                      config_.buddies[static_cast<size_t>(step.owner)] >= 0;
  }
  try {
    auto conn = connection(server, failed_over || lost_with_buddy
                                       ? config_.failover_connect_timeout
                                       : config_.connect_timeout);
    refused_.erase(server);
    return conn;
  } catch (const client::ConnectionLost& e) {
    refused_[server] = {step.step, e.message()};
    throw;
  }
}

void Relay::watch(const std::shared_ptr<client::Connection>& conn, int owner) {
  std::weak_ptr<client::Connection> weak = conn;  // the callbacks live inside the connection
  conn->set_update_callback([this, weak](const std::string& name, int64_t step) {
    RelayStep st;
    std::function<void(RelayStep)> deliver;
    {
      std::lock_guard lk(subscriptions_mu_);
      const auto it = subscriptions_.find(name);
      // A forwarded step: its waiter takes it.
      if (it == subscriptions_.end() || !it->second.unasked_updates) return;
      st = it->second.prototype;
      deliver = it->second.deliver;
    }
    st.step = step;
    st.unasked = true;
    waiter(st.owner).push([this, weak, st = std::move(st), deliver]() mutable {
      try {
        if (auto c = weak.lock()) take_update(*c, st);
      } catch (const std::exception& e) {
        st.error = error_of(e, st.owner, st.name, st.step);
      }
      post_([deliver, st = std::move(st)]() mutable { deliver(std::move(st)); });
    });
  });
  conn->set_error_callback([this, owner](const ErrorMsg& error) -> bool {
    if (error.param.empty()) {  // the owner is gone: its unasked updates will not come
      std::vector<std::pair<std::function<void(RelayStep)>, RelayStep>> lost;
      {
        std::lock_guard lk(subscriptions_mu_);
        for (const auto& [name, sub] : subscriptions_) {
          if (sub.prototype.owner != owner || !sub.unasked_updates) continue;
          RelayStep st = sub.prototype;
          st.step = -1;
          st.unasked = true;
          st.error = ErrorMsg{ErrorCode::peer_lost,
                              "relay " + describe(config_.server_id) + " lost owner " +
                                  describe(owner) + " of '" + name + "': " + error.message,
                              name, -1, -1};
          lost.emplace_back(sub.deliver, std::move(st));
        }
      }
      for (auto& [deliver, st] : lost) {
        post_([deliver, st = std::move(st)]() mutable { deliver(std::move(st)); });
      }
      // Connect again (registering everything again) without waiting for a step to need it;
      // briefly (the sender waits on it): a server not up yet is the next step's to wait for.
      if (!stopping_ && !lost.empty()) {
        sender_.push([this, owner] {
          try {
            connection(resolve(owner), config_.failover_connect_timeout);
          } catch (const std::exception&) {  // the next step that needs it tries again
          }
        });
      }
      return false;
    }
    std::lock_guard lk(subscriptions_mu_);
    const auto it = subscriptions_.find(error.param);
    if (it == subscriptions_.end()) return false;
    // A forwarded step waits for its answer: the waiter throws it.
    if (in_flight_.count({error.param, error.step})) return false;
    // Otherwise nothing of this relay waits for it (an unasked update's step, or a step the owner
    // dropped before this relay forwarded it): the domain's ranks get it now, and it cannot
    // poison a later forward of the same step.
    RelayStep st = it->second.prototype;
    st.step = error.step;
    st.unasked = true;
    st.error = error;
    st.error->message = "owner " + describe(owner) + ": " + error.message;
    post_([deliver = it->second.deliver, st = std::move(st)]() mutable { deliver(std::move(st)); });
    return true;
  });
}

void Relay::landed(const RelayStep& step) {
  std::lock_guard lk(subscriptions_mu_);
  in_flight_.erase({step.name, step.step});
}

void Relay::take_update(client::Connection& conn, RelayStep& step) {
  int64_t packed = 0;
  for (const auto& r : step.want) packed += r.size();
  const size_t esize = transport::dtype_bytes(step.update_dtype);
  std::vector<std::byte> bytes(static_cast<size_t>(packed) * esize);
  step.applied = conn.wait_update(step.name, step.step, bytes.data());
  // Packed want ranges (update dtype), scattered into the full-size update.
  step.update.assign(static_cast<size_t>(step.numel), 0.0f);
  int64_t pos = 0;
  for (const auto& r : step.want) {
    widen_to_f32(step.update_dtype, bytes.data() + static_cast<size_t>(pos) * esize,
                 std::span(step.update).subspan(static_cast<size_t>(r.begin),
                                                static_cast<size_t>(r.size())));
    pos += r.size();
  }
}

void Relay::register_param(int owner, transport::RegisterParam reg,
                           std::function<void(std::optional<ErrorMsg>, transport::RegisterOk)> done,
                           std::function<void(RelayStep)> events) {
  {  // before the registration: the owner may send a step's update right after it
    RelayStep proto;
    proto.name = reg.name;
    proto.owner = owner;
    proto.grad_dtype = reg.grad_dtype;
    proto.update_dtype = reg.update_dtype;
    proto.numel = 1;
    for (auto d : reg.shape) proto.numel *= d;
    proto.want = reg.want;
    const bool unasked = reg.push.empty() && !reg.want.empty();
    std::lock_guard lk(subscriptions_mu_);
    subscriptions_[reg.name] = {std::move(proto), std::move(events), unasked};
  }
  sender_.push([this, owner, reg = std::move(reg), done = std::move(done)]() mutable {
    std::shared_ptr<client::Connection> conn;
    uint32_t id = 0;
    try {
      conn = connection(resolve(owner));
      conn->expect_updates(reg.name, reg.want, transport::dtype_bytes(reg.update_dtype));
      id = conn->send_register(reg);
    } catch (const std::exception& e) {
      post_([done, err = error_of(e, owner, reg.name, -1)] { done(err, {}); });
      return;
    }
    // A name registered anew (another job took it over) replaces its earlier registration.
    std::erase_if(registered_[owner], [&](const auto& r) { return r.name == reg.name; });
    registered_[owner].push_back(reg);
    waiter(owner).push([this, owner, conn, id, name = reg.name, done = std::move(done)] {
      try {
        auto ok = conn->wait_register(id, name);
        post_([done, ok] { done(std::nullopt, ok); });
      } catch (const std::exception& e) {
        post_([done, err = error_of(e, owner, name, -1)] { done(err, {}); });
        // Not registered after all: a reconnect must not replay it.
        sender_.push([this, owner, name] {
          std::erase_if(registered_[owner], [&](const auto& r) { return r.name == name; });
        });
      }
    });
  });
}

void Relay::forward(RelayStep step, std::function<void(RelayStep)> done) {
  sender_.push([this, step = std::move(step), done = std::move(done)]() mutable {
    std::shared_ptr<client::Connection> conn;
    {
      std::lock_guard lk(subscriptions_mu_);
      in_flight_.insert({step.name, step.step});
    }
    // The server lost under this step: the step goes to the other of the pair (owner, buddy),
    // from the partial sum still held here, at most twice (both lost: the error below).
    const auto again = [this](RelayStep& st, const std::exception& e, int server,
                              std::function<void(RelayStep)>& d) {
      if (dynamic_cast<const client::ConnectionLost*>(&e) == nullptr || st.failovers >= 2 ||
          !fail_over(st.owner, server, e.what())) {
        return false;
      }
      ++st.failovers;
      landed(st);
      forward(std::move(st), std::move(d));
      return true;
    };
    const int server = resolve(step.owner);
    try {
      conn = step_connection(server, step);
      std::vector<uint16_t> narrow;
      for (const auto& r : step.push) {
        const float* src = step.grad.data() + r.begin;
        if (step.grad_dtype == DType::f32) {
          conn->push(step.name, step.step, r.begin, reinterpret_cast<const std::byte*>(src),
                     r.size(), 4, transport::ChunkKind::gradient);
        } else {  // the partial sum travels in the registered dtype (round to nearest even)
          narrow.resize(static_cast<size_t>(r.size()));
          narrow_from_f32(DType::bf16, std::span(src, narrow.size()), narrow.data());
          conn->push(step.name, step.step, r.begin,
                     reinterpret_cast<const std::byte*>(narrow.data()), r.size(), 2,
                     transport::ChunkKind::gradient);
        }
      }
      conn->commit(step.name, step.step);
    } catch (const std::exception& e) {
      if (again(step, e, server, done)) return;
      step.error = forward_error(e, server, step);
      landed(step);
      post_([done, step = std::move(step)]() mutable { done(std::move(step)); });
      return;
    }
    waiter(server).push([this, conn, server, again, step = std::move(step),
                         done = std::move(done)]() mutable {
      try {
        if (!step.want.empty()) take_update(*conn, step);
      } catch (const std::exception& e) {
        if (again(step, e, server, done)) return;
        step.error = forward_error(e, server, step);
      }
      landed(step);
      post_([done, step = std::move(step)]() mutable { done(std::move(step)); });
    });
  });
}

void Relay::forward_momentum(int owner, const std::string& name, int64_t step, int64_t offset,
                             std::vector<float> values, std::function<void(ErrorMsg)> failed) {
  sender_.push([this, owner, name, step, offset, values = std::move(values),
                failed = std::move(failed)] {
    try {
      connection(resolve(owner))
          ->push(name, step, offset, reinterpret_cast<const std::byte*>(values.data()),
                              static_cast<int64_t>(values.size()), 4,
                              transport::ChunkKind::momentum);
    } catch (const std::exception& e) {
      post_([failed, err = error_of(e, owner, name, step)] { failed(err); });
    }
  });
}

void Relay::fetch_momentum(
    int owner, const std::string& name, int64_t numel,
    std::function<void(std::vector<float>, int64_t, std::optional<ErrorMsg>)> done) {
  sender_.push([this, owner, name, numel, done = std::move(done)] {
    std::shared_ptr<client::Connection> conn;
    const int server = resolve(owner);
    try {
      conn = connection(server);
    } catch (const std::exception& e) {
      post_([done, err = error_of(e, server, name, -1)] { done({}, -1, err); });
      return;
    }
    // On the waiter, behind the answers owed before it: the fetch sees every earlier push.
    waiter(server).push([this, owner, conn, name, numel, done] {
      try {
        int64_t last = -1;
        auto values = conn->fetch_momentum(name, numel, &last);
        post_([done, values = std::move(values), last]() mutable {
          done(std::move(values), last, std::nullopt);
        });
      } catch (const std::exception& e) {
        post_([done, err = error_of(e, owner, name, -1)] { done({}, -1, err); });
      }
    });
  });
}

}  // namespace muon::daemon
