#include "daemon/pool/relay.hpp"

#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.hpp"
#include "daemon/log.hpp"
#include "kernels/bf16.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::DType;
using transport::ErrorMsg;

namespace {

// The owner's update as it came (the want elements packed in ascending order, update dtype),
// widened into step.update: numel fp32, zeros outside the want elements. False, changing
// nothing, when `values` are not exactly the want elements (the link assembles exactly those).
bool scatter_update(RelayStep& step, const std::vector<std::byte>& values) {
  const RangeSet want = RangeSet::union_of(step.want);
  std::vector<float> packed(static_cast<size_t>(want.elements()));
  if (values.size() != packed.size() * transport::dtype_bytes(step.update_dtype)) return false;
  widen_to_f32(step.update_dtype, values.data(), std::span(packed));
  step.update.assign(static_cast<size_t>(step.numel), 0.0f);
  want.scatter(packed.data(), step.update.data(), sizeof(float));
  return true;
}

// The error of an update that scatter_update refused.
ErrorMsg malformed_update(const RelayStep& step, size_t bytes) {
  return {ErrorCode::internal,
          "the owner's update of '" + step.name + "' step " + std::to_string(step.step) + " has " +
              std::to_string(bytes) + " bytes, not those of the elements this relay wants",
          step.name, step.step, -1};
}

}  // namespace

Relay::Relay(RelayConfig config, asio::io_context& io) : config_(std::move(config)), io_(io) {
  config_.peers.check("relay");
}

Relay::~Relay() {
  for (auto& [id, link] : links_) link->close();
  for (auto& [key, f] : forwards_) {
    if (f.timer) f.timer->cancel();
  }
}

void Relay::leave() {
  for (auto& [id, link] : links_) link->leave();
}

void Relay::later(std::function<void()> fn) {
  asio::post(io_, [alive = std::weak_ptr<bool>(alive_), fn = std::move(fn)] {
    if (alive.lock()) fn();
  });
}

std::string Relay::describe(int id) const {
  return config_.peers.describe(id);
}

int Relay::buddy_of(int owner) const {
  return owner >= 0 && owner < static_cast<int>(config_.buddies.size())
             ? config_.buddies[static_cast<size_t>(owner)]
             : -1;
}

ErrorMsg Relay::error_of(const LinkError& e, int owner, const std::string& name,
                         int64_t step) const {
  if (e.kind == LinkError::Kind::refused) {
    return {e.code, "owner " + describe(owner) + ": " + e.message, name, step, -1};
  }
  return {e.kind == LinkError::Kind::timeout ? ErrorCode::timeout : ErrorCode::peer_lost,
          "relay " + describe(config_.peers.server_id) + " cannot reach owner " + describe(owner) +
              " of '" + name + "': " + e.message,
          name, step, -1};
}

ErrorMsg Relay::forward_error(const LinkError& e, int server, const RelayStep& step) const {
  ErrorMsg err = error_of(e, server, step.name, step.step);
  if (e.kind != LinkError::Kind::lost) return err;
  std::vector<int> lost{step.owner};
  const int buddy = buddy_of(step.owner);
  if (step.failovers > 0 && buddy >= 0) lost.push_back(buddy);
  auto servers = nlohmann::json::array();
  for (int id : lost) {
    const std::string& endpoint = config_.peers.endpoints[static_cast<size_t>(id)];
    const auto it = snapshots_.find(id);
    if (it == snapshots_.end()) servers.push_back({endpoint});  // never said (no hello)
    else servers.push_back({endpoint, it->second.first, it->second.second});
  }
  err.message += "\nsnapshots of the lost servers (JSON): " +
                 servers.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return err;
}

// ---- where a parameter's steps go --------------------------------------------------------------

int Relay::target_of(int owner) const {
  const auto it = targets_.find(owner);
  return it == targets_.end() ? owner : it->second;
}

bool Relay::fail_over(int owner, int from, const std::string& why) {
  const int buddy = buddy_of(owner);
  if (buddy < 0) return false;
  const int current = target_of(owner);
  if (current != from) return true;  // failed over already
  const int next = from == owner ? buddy : owner;
  targets_[owner] = next;
  moved_[next].insert(owner);
  // Back to a server found lost before (both of the pair lost): no replica is promised there.
  log()->warn("relay {}: {} was lost ({}); the parameters of owner {} go to {} from now on, {}",
              describe(config_.peers.server_id), describe(from), why, describe(owner),
              describe(next),
              lost_.count(next) != 0
                  ? "which was lost too: the steps in flight fail unless it answers again"
                  : "which holds their replica; steps in flight are pushed there again");
  // The lost link goes now: when the parameters come back to `from` (restarted), a new session
  // is made. Every step still waiting on it goes again (settle fails it over).
  if (auto it = links_.find(from); it != links_.end()) {
    const uint64_t gen = link_gen_[from];
    it->second->abandon("lost: " + why);
    links_.erase(it);
    lost_.insert(from);
    std::vector<std::pair<Key, uint64_t>> waiting;
    for (const auto& [key, f] : forwards_) {
      if (f.link == gen) waiting.emplace_back(key, f.id);
    }
    for (const auto& [key, id] : waiting) {
      settle(key, id, LinkError{LinkError::Kind::lost, ErrorCode::peer_lost, "lost: " + why});
    }
  }
  return true;
}

int Relay::resolve(int owner) {
  const int t = target_of(owner);
  const auto it = links_.find(t);
  // A link that was up and broke; one that never connected fails its own calls.
  if (it != links_.end() && !it->second->alive()) {
    const LinkError why = *it->second->failure();  // a copy: fail_over drops the link
    if (!why.never_connected && why.kind != LinkError::Kind::refused &&
        fail_over(owner, t, why.message)) {
      return target_of(owner);
    }
  }
  return t;
}

// ---- links -------------------------------------------------------------------------------------

void Relay::register_all(int server, PeerLink& link, const std::vector<int>& owners) {
  for (int o : owners) {
    for (const auto& reg : registered_[o]) {
      link.expect_updates(reg.name, reg.want, reg.update_dtype);
      link.register_param(reg, [this, server, name = reg.name](LinkResult result,
                                                                 transport::RegisterOk ok) {
        if (result) {  // its forwards go by name, and the server's refusal fails them
          log()->warn("relay {}: registering '{}' again with {} failed: {}",
                      describe(config_.peers.server_id), name, describe(server), result->message);
          return;
        }
        const auto it = subscriptions_.find(name);
        if (it == subscriptions_.end()) return;
        RelayStep st = it->second.prototype;
        st.step = ok.last_step;
        st.resync = true;
        st.owner = server;
        it->second.deliver(std::move(st));
      });
    }
  }
}

std::shared_ptr<PeerLink> Relay::link_to(int server, std::chrono::milliseconds connect_timeout) {
  if (!config_.peers.is_peer(server)) {
    throw InvalidArgument("relay: no owner " + std::to_string(server) + " in a pool of " +
                          std::to_string(config_.peers.endpoints.size()) +
                          " servers (this one is " + std::to_string(config_.peers.server_id) +
                          ")");
  }
  auto& link = links_[server];
  if (link && link->alive()) {
    auto moved = std::move(moved_[server]);
    moved_.erase(server);
    register_all(server, *link, {moved.begin(), moved.end()});
    return link;
  }
  if (link && !link->failure()->never_connected) lost_.insert(server);
  // A new session: every owner whose parameters go to `server` registers there again (the
  // server restarted, or the connection broke, or they failed over to it).
  std::vector<int> owners;
  for (const auto& [o, regs] : registered_) {
    if (target_of(o) == server) owners.push_back(o);
  }
  moved_.erase(server);
  const auto& peers = config_.peers;
  PeerLinkConfig c = peers.link_config(
      server, transport::relay_rank(peers.world_size, peers.server_id), /*relay=*/true,
      "muon-offloadd at " + peers.endpoints[static_cast<size_t>(peers.server_id)],
      connect_timeout, config_.op_timeout);
  const uint64_t gen = ++next_gen_;
  link_gen_[server] = gen;
  PeerLinkEvents events;
  events.connected = [this, server, gen](const transport::HelloOk& ok) {
    if (link_gen_[server] != gen) return;
    lost_.erase(server);
    refused_.erase(server);
    if (!ok.server_version.empty()) snapshots_[server] = {ok.snapshot_path, ok.snapshot_every};
  };
  events.update = [this, gen](const std::string& name, int64_t step, bool applied,
                              std::vector<std::byte> values) {
    on_update(gen, name, step, applied, values);
  };
  events.error = [this, server, gen](const ErrorMsg& e) { on_error(server, gen, e); };
  events.lost = [this, server, gen](const LinkError& e) { on_lost(server, gen, e); };
  link = PeerLink::open(io_, std::move(c), std::move(events));
  register_all(server, *link, owners);
  return link;
}

// ---- what the owners say -----------------------------------------------------------------------

void Relay::on_update(uint64_t gen, const std::string& name, int64_t step, bool applied,
                      const std::vector<std::byte>& values) {
  const auto f = forwards_.find({name, step});
  if (f != forwards_.end() && f->second.link == gen) {
    settle(f->first, f->second.id, std::nullopt, applied, &values);
    return;
  }
  const auto it = subscriptions_.find(name);
  if (it == subscriptions_.end() || !it->second.unasked_updates) return;
  // A domain that pushes nothing to the parameter: the owner sends its updates unasked.
  RelayStep st = it->second.prototype;
  st.step = step;
  st.unasked = true;
  st.applied = applied;
  if (!scatter_update(st, values)) st.error = malformed_update(st, values.size());
  it->second.deliver(std::move(st));
}

void Relay::on_error(int server, uint64_t gen, const ErrorMsg& e) {
  const LinkError refused{LinkError::Kind::refused, e.code, e.message};
  if (e.param.empty()) {  // about the whole session: every step waiting on it fails
    std::vector<std::pair<Key, uint64_t>> waiting;
    for (const auto& [key, f] : forwards_) {
      if (f.link == gen) waiting.emplace_back(key, f.id);
    }
    for (const auto& [key, id] : waiting) settle(key, id, refused);
    return;
  }
  const auto f = forwards_.find({e.param, e.step});
  if (f != forwards_.end() && f->second.link == gen) {  // the answer to this forward
    settle(f->first, f->second.id, refused);
    return;
  }
  const auto it = subscriptions_.find(e.param);
  if (it == subscriptions_.end()) return;
  // Nothing of this relay waits for it (an unasked update's step, or a step the owner dropped
  // before this relay forwarded it): the domain's ranks get it now.
  RelayStep st = it->second.prototype;
  st.step = e.step;
  st.unasked = true;
  st.error = e;
  st.error->message = "owner " + describe(server) + ": " + e.message;
  it->second.deliver(std::move(st));
}

void Relay::on_lost(int server, uint64_t gen, const LinkError& error) {
  if (link_gen_[server] == gen && !error.never_connected) lost_.insert(server);
  // The owner's unasked updates will not come.
  bool unasked = false;
  std::vector<std::function<void()>> tell;
  for (const auto& [name, sub] : subscriptions_) {
    if (sub.prototype.owner != server || !sub.unasked_updates) continue;
    unasked = true;
    RelayStep st = sub.prototype;
    st.step = -1;
    st.unasked = true;
    st.error = ErrorMsg{ErrorCode::peer_lost,
                        "relay " + describe(config_.peers.server_id) + " lost owner " +
                            describe(server) + " of '" + name + "': " + error.message,
                        name, -1, -1};
    tell.push_back([deliver = sub.deliver, st = std::move(st)]() mutable {
      deliver(std::move(st));
    });
  }
  for (auto& t : tell) t();
  // Steps waiting on the link go again to the other of the pair, or fail.
  std::vector<std::pair<Key, uint64_t>> waiting;
  for (const auto& [key, f] : forwards_) {
    if (f.link == gen) waiting.emplace_back(key, f.id);
  }
  for (const auto& [key, id] : waiting) settle(key, id, error);
  // Connect again (registering everything again) without waiting for a step to need it,
  // briefly: a server not up yet is the next step's to wait for.
  if (unasked && !error.never_connected && link_gen_[server] == gen) {
    try {
      link_to(resolve(server), config_.failover_connect_timeout);
    } catch (const std::exception&) {  // the next step that needs it tries again
    }
  }
}

// ---- forwarding --------------------------------------------------------------------------------

void Relay::register_param(
    int owner, transport::RegisterParam reg,
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
    subscriptions_[reg.name] = {std::move(proto), std::move(events), unasked};
  }
  std::shared_ptr<PeerLink> link;
  try {
    link = link_to(resolve(owner), config_.connect_timeout);  // replays what went before
  } catch (const std::exception& e) {
    later([done, err = error_of({LinkError::Kind::lost, ErrorCode::peer_lost, e.what()}, owner,
                                reg.name, -1)] { done(err, {}); });
    return;
  }
  // A name registered anew (another job took it over) replaces its earlier registration.
  std::erase_if(registered_[owner], [&](const auto& r) { return r.name == reg.name; });
  registered_[owner].push_back(reg);
  link->expect_updates(reg.name, reg.want, reg.update_dtype);
  link->register_param(reg, [this, owner, name = reg.name, done = std::move(done)](
                                LinkResult result, transport::RegisterOk ok) {
    if (!result) {
      done(std::nullopt, ok);
      return;
    }
    done(error_of(*result, owner, name, -1), {});
    // Not registered after all: a reconnect must not replay it.
    std::erase_if(registered_[owner], [&](const auto& r) { return r.name == name; });
  });
}

void Relay::forward(RelayStep step, std::function<void(RelayStep)> done) {
  const Key key{step.name, step.step};
  const int server = resolve(step.owner);
  Forward f;
  f.id = ++next_forward_;
  f.server = server;
  f.done = std::move(done);
  f.grad = std::make_shared<std::vector<float>>(std::move(step.grad));
  const uint64_t id = f.id;
  ++owed_[server];
  // A step of P parameters whose owner and buddy are both lost waits for each connect once,
  // not P times: a server that refused this step's connection refuses its other forwards.
  if (const auto r = refused_.find(server); r != refused_.end() && r->second.first == step.step) {
    f.step = std::move(step);
    forwards_[key] = std::move(f);
    later([this, key, id, why = r->second.second] {
      settle(key, id, LinkError{LinkError::Kind::lost, ErrorCode::peer_lost, why, true});
    });
    return;
  }
  // A failover's target was running when the step went there: refused, it is lost too. So is
  // a lost owner that has a buddy: the step goes there rather than wait for a restart.
  const bool failed_over = step.failovers > 0 || server != step.owner;
  const bool lost_with_buddy = lost_.count(server) != 0 && buddy_of(step.owner) >= 0;
  std::shared_ptr<PeerLink> link;
  try {
    link = link_to(server, failed_over || lost_with_buddy ? config_.failover_connect_timeout
                                                          : config_.connect_timeout);
  } catch (const std::exception& e) {
    f.step = std::move(step);
    forwards_[key] = std::move(f);
    later([this, key, id, why = std::string(e.what())] {
      settle(key, id, LinkError{LinkError::Kind::refused, ErrorCode::bad_request, why});
    });
    return;
  }
  f.link = link_gen_[server];
  // The partial sum travels in the registered dtype (bf16: rounded to nearest even).
  std::shared_ptr<const void> keep = f.grad;
  const float* grad = f.grad->data();
  std::shared_ptr<std::vector<uint16_t>> narrow;
  if (step.grad_dtype != DType::f32) {
    narrow = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(step.numel));
    for (const auto& r : step.push) {
      narrow_from_f32(step.grad_dtype, std::span(grad + r.begin, static_cast<size_t>(r.size())),
                      narrow->data() + r.begin);
    }
    keep = narrow;
  }
  const size_t esize = transport::dtype_bytes(step.grad_dtype);
  const auto* base = narrow ? reinterpret_cast<const std::byte*>(narrow->data())
                            : reinterpret_cast<const std::byte*>(grad);
  auto failed = [this, key, id](LinkResult result) {
    if (result) settle(key, id, result);
  };
  for (const auto& r : step.push) {
    link->push(step.name, step.step, r.begin,
               std::span(base + static_cast<size_t>(r.begin) * esize,
                         static_cast<size_t>(r.size()) * esize),
               step.grad_dtype, transport::ChunkKind::gradient, keep, failed);
  }
  const bool wants = !step.want.empty();
  link->commit(step.name, step.step, [this, key, id, wants](LinkResult result) {
    if (result || !wants) settle(key, id, result);
  });
  if (wants) {
    f.timer = std::make_shared<asio::steady_timer>(io_, config_.op_timeout);
    f.timer->async_wait([this, alive = std::weak_ptr<bool>(alive_), key, id,
                         what = "the update of '" + step.name + "' step " +
                                std::to_string(step.step) + " did not arrive from '" +
                                config_.peers.endpoints[static_cast<size_t>(server)] +
                                "' within " +
                                std::to_string(config_.op_timeout.count()) + " ms"](
                            const boost::system::error_code& ec) {
      if (ec || !alive.lock()) return;
      settle(key, id, LinkError{LinkError::Kind::timeout, ErrorCode::timeout, what});
    });
  }
  f.step = std::move(step);
  forwards_[key] = std::move(f);
}

void Relay::settle(const Key& key, uint64_t id, std::optional<LinkError> error, bool applied,
                   const std::vector<std::byte>* values) {
  const auto it = forwards_.find(key);
  if (it == forwards_.end() || it->second.id != id) return;  // settled already
  Forward f = std::move(it->second);
  forwards_.erase(it);
  if (f.timer) f.timer->cancel();
  RelayStep step = std::move(f.step);
  // The partial sum, back to the step (a link that still holds it keeps its own copy alive).
  step.grad = f.grad.use_count() == 1 ? std::move(*f.grad) : *f.grad;
  if (--owed_[f.server] == 0) run_fetches(f.server);
  if (error) {
    if (error->kind == LinkError::Kind::lost && error->never_connected) {
      refused_[f.server] = {step.step, error->message};
    }
    // The server lost under this step: the step goes to the other of the pair (owner, buddy),
    // from the partial sum still held here, at most twice (both lost: the error below).
    if (error->kind == LinkError::Kind::lost && step.failovers < 2 &&
        fail_over(step.owner, f.server, error->message)) {
      ++step.failovers;
      forward(std::move(step), std::move(f.done));
      return;
    }
    step.error = forward_error(*error, f.server, step);
  } else if (values != nullptr) {
    step.applied = applied;
    if (!scatter_update(step, *values)) step.error = malformed_update(step, values->size());
  }
  later([done = std::move(f.done), step = std::move(step)]() mutable { done(std::move(step)); });
}

void Relay::forward_momentum(int owner, const std::string& name, int64_t step, int64_t offset,
                             std::vector<float> values, std::function<void(ErrorMsg)> failed) {
  std::shared_ptr<PeerLink> link;
  try {
    link = link_to(resolve(owner), config_.connect_timeout);
  } catch (const std::exception& e) {
    later([failed, err = error_of({LinkError::Kind::lost, ErrorCode::peer_lost, e.what()}, owner,
                                  name, step)] { failed(err); });
    return;
  }
  auto buffer = std::make_shared<std::vector<float>>(std::move(values));
  link->push(name, step, offset, std::as_bytes(std::span(*buffer)), DType::f32,
             transport::ChunkKind::momentum, buffer,
             [this, owner, name, step, failed = std::move(failed)](LinkResult result) {
               if (result) failed(error_of(*result, owner, name, step));
             });
}

void Relay::fetch_momentum(
    int owner, const std::string& name, int64_t numel,
    std::function<void(std::vector<float>, int64_t, std::optional<ErrorMsg>)> done) {
  // Behind the answers owed before it: the fetch sees every earlier push.
  auto run = [this, owner, name, numel, done = std::move(done)] {
    std::shared_ptr<PeerLink> link;
    try {
      link = link_to(resolve(owner), config_.connect_timeout);
    } catch (const std::exception& e) {
      later([done, err = error_of({LinkError::Kind::lost, ErrorCode::peer_lost, e.what()}, owner,
                                  name, -1)] { done({}, -1, err); });
      return;
    }
    link->fetch_momentum(name, numel, -1,
                         [this, owner, name, done](LinkResult result, std::vector<float> values,
                                                   int64_t last) {
                           if (result) done({}, -1, error_of(*result, owner, name, -1));
                           else done(std::move(values), last, std::nullopt);
                         });
  };
  const int server = target_of(owner);
  if (owed_[server] > 0) {
    fetches_[server].push_back(std::move(run));
    return;
  }
  run();
}

void Relay::run_fetches(int server) {
  auto waiting = std::move(fetches_[server]);
  fetches_.erase(server);
  for (auto& run : waiting) later(std::move(run));
}

}  // namespace muon::daemon
