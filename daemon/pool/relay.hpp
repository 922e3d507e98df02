// The relay side of the pool (daemon/pool_routes.hpp): a server that relays a parameter for its
// domain sums the domain's contributions as for any parameter (daemon/step_reducer.hpp), then
// forwards that one partial sum to the owner server and hands the owner's update back to its
// domain's ranks. Toward the owner it is a client (a PeerLink) that says hello as
// rank transport::relay_rank(world_size, server id), so the owner sums relays after the ranks that
// push to it directly, in server-id order: the step's gradient is, for every element,
//   ((ranks of the owner's domain, ascending) + partial(relay a)) + partial(relay b) ...
// with each partial the sum of its domain's ranks in ascending order: the same for every chunking
// and arrival order (architecture guide, "Equivalence contract").
//
// Failover (docs/design.md, "Failover"): an owner with a buddy (RelayConfig::buddies) that is
// lost is not connected to again: its parameters go to its buddy, which holds their replica
// (daemon/pool/replicator.hpp). They are registered there, and the step in flight is pushed there
// again from the partial sum this relay keeps until an answer comes, so the domain's ranks see
// nothing. When that server is lost in turn, they go back to the owner (restarted meanwhile,
// holding the buddy's replicas).
//
// Threads: none of its own. Everything runs on the io thread: each owner is reached through a
// PeerLink (daemon/pool/peer_link.hpp), its frames on a strand of the server's io_context, its
// pushes copied into the owner's ring as credits come back. Nothing here blocks the io thread.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/pool/peer_link.hpp"
#include "daemon/pool/pool_peers.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

/// How this server relays to the pool's owners.
struct RelayConfig {
  PoolPeers peers;
  std::chrono::milliseconds connect_timeout{10000};
  /// Connecting to the other of the pair (owner, buddy) when a step fails over: a running
  /// server already (it holds the replicas, or took them back), so a refused connect means it
  /// is lost too, not still starting; this bounds the wait before the "both lost" error.
  std::chrono::milliseconds failover_connect_timeout{1000};
  std::chrono::milliseconds op_timeout{120000};
  /// By server id: its buddy (plan servers[].buddy, -1 none): where its parameters go when it
  /// is lost. Empty: no failover (a lost owner is connected to again at the next step).
  std::vector<int> buddies;
};

/// One relayed step of one parameter, in and out.
struct RelayStep {
  std::string name;
  int64_t step = 0;
  int owner = -1;
  transport::DType grad_dtype = transport::DType::f32;
  transport::DType update_dtype = transport::DType::f32;
  int64_t numel = 0;        ///< in: the parameter's elements
  std::vector<float> grad;  ///< in: the domain's partial sum, numel fp32 (handed back out)
  std::vector<transport::Range> push;  ///< in: elements of grad the domain's ranks push
  std::vector<transport::Range> want;  ///< in: elements of the update they want (may be empty)
  /// out: numel fp32, the owner's update at the want elements (widened when bf16), 0 elsewhere
  std::vector<float> update;
  bool applied = true;                       ///< out: false when the owner skipped the step
  std::optional<transport::ErrorMsg> error;  ///< out: the owner's error, or a lost owner
  /// out: not the answer to a forward: an update the owner sent unasked (a domain that pushes
  /// nothing to the parameter), or the owner's error about a step this relay did not forward
  /// (step -1: the owner was lost)
  bool unasked = false;
  /// out: only `step` is set, the owner's last applied step, after registering again with an
  /// owner that restarted
  bool resync = false;
  /// Times this step was pushed again to another server after the one it went to was lost.
  int failovers = 0;
};

class Relay {
 public:
  /// Connects to owners only when first needed, on `io` (the server's io_context, run by its one
  /// io thread, the only thread that may call the relay). Throws InvalidArgument when
  /// config.peers.server_id is not in the pool.
  Relay(RelayConfig config, boost::asio::io_context& io);
  /// Closes every owner link; nothing owed is called any more.
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// Registers `reg` (push and want as this relay forwards them) with server `owner`; `done`
  /// runs later on the io thread with the owner's RegisterOk, or the error (the owner's refusal,
  /// a timeout, an unreachable owner: code peer_lost). `events` receives what the owner says
  /// about the parameter outside the answers to forward(): its errors about steps this relay did
  /// not forward (RelayStep with unasked and error set); for a parameter the domain does not push
  /// (reg.push empty) but wants, each step's update, which the owner sends unasked, and the loss
  /// of the owner (step -1, peer_lost); after a reconnection, the owner's last applied step
  /// (resync).
  void register_param(
      int owner, transport::RegisterParam reg,
      std::function<void(std::optional<transport::ErrorMsg>, transport::RegisterOk)> done,
      std::function<void(RelayStep)> events);
  /// Pushes step.grad's push elements to the owner (in step.grad_dtype), commits, and waits for
  /// the update of the want elements; `done` runs later on the io thread with `step` filled in.
  void forward(RelayStep step, std::function<void(RelayStep)> done);
  /// Forwards a momentum load chunk (fp32) of parameter `name` (last applied step `step`) to
  /// `owner`; a failure comes back through `failed` later on the io thread.
  void forward_momentum(int owner, const std::string& name, int64_t step, int64_t offset,
                        std::vector<float> values, std::function<void(transport::ErrorMsg)> failed);
  /// Fetches the owner's momentum of `name` (numel fp32) once the steps forwarded to it before
  /// are answered; `done(values, last_step, error)` later on the io thread.
  void fetch_momentum(
      int owner, const std::string& name, int64_t numel,
      std::function<void(std::vector<float>, int64_t, std::optional<transport::ErrorMsg>)> done);

  /// The endpoint of server `id` ("server 3 (tcp://h:29603)") for messages.
  std::string describe(int id) const;
  /// The server stops in order: each owner link says goodbye (PeerLink::leave), nothing owed is
  /// called any more. The relay is not used after this.
  void leave();

 private:
  using Key = std::pair<std::string, int64_t>;  // (parameter, step)
  /// A step forwarded and not answered yet.
  struct Forward {
    uint64_t id = 0;   ///< tells a forward again of the same key from this one
    RelayStep step;    ///< its grad is in `grad` meanwhile
    std::function<void(RelayStep)> done;
    int server = -1;   ///< where it went (the owner, or its buddy after a failover)
    uint64_t link = 0;  ///< the generation of the link it went through
    std::shared_ptr<std::vector<float>> grad;  ///< held by the link's pushes while they last
    std::shared_ptr<boost::asio::steady_timer> timer;  ///< the update's op timeout
  };
  /// Parameters whose events go to the Engine, by name: a prototype RelayStep (name, owner,
  /// dtypes, numel, want) and where each goes.
  struct Subscription {
    RelayStep prototype;
    std::function<void(RelayStep)> deliver;
    bool unasked_updates = false;  // the domain pushes nothing: the owner sends updates unasked
  };

  /// The live link to `server`, made (connecting within `connect_timeout`, every registration
  /// of the owners whose parameters go there replayed) when there is none or it was lost; on an
  /// existing one, the parameters failed over to it since are registered first. Throws
  /// InvalidArgument for a server not in the pool (or this one).
  std::shared_ptr<PeerLink> link_to(int server, std::chrono::milliseconds connect_timeout);
  /// Registers every parameter of plan owners `owners` on `link` (to `server`) and, as each is
  /// answered, tells the Engine the server's last applied step (resync).
  void register_all(int server, PeerLink& link, const std::vector<int>& owners);
  /// The server the parameters of plan owner `owner` go to now: the owner, or after a failover
  /// its buddy (and back).
  int target_of(int owner) const;
  /// target_of, after failing over when the link to it is known lost.
  int resolve(int owner);
  /// Server `from`, which the parameters of `owner` went to, was lost: they go to the other of
  /// the pair (owner, its buddy) from now on, and every step still waiting on `from` goes there
  /// again. True when they did (or already had); false when the owner has no buddy.
  bool fail_over(int owner, int from, const std::string& why);
  /// Ends the forward (key, id), if still owed: the update scattered into step.update, or on
  /// `error` the step again to the other of the pair (a lost server, at most twice) or the
  /// error. `values`: the packed want values (update dtype).
  void settle(const Key& key, uint64_t id, std::optional<LinkError> error, bool applied = true,
              const std::vector<std::byte>* values = nullptr);
  /// The link of generation `gen` (to `server`) is lost: unasked-update subscriptions hear it,
  /// its forwards go again or fail.
  void on_lost(int server, uint64_t gen, const LinkError& error);
  void on_update(uint64_t gen, const std::string& name, int64_t step, bool applied,
                 const std::vector<std::byte>& values);
  void on_error(int server, uint64_t gen, const transport::ErrorMsg& error);
  /// Runs the momentum fetches that waited for `server`'s forwards, once none is owed.
  void run_fetches(int server);
  /// An ErrorMsg for a failed call toward `owner` about (name, step).
  transport::ErrorMsg error_of(const LinkError& e, int owner, const std::string& name,
                               int64_t step) const;
  /// error_of for a forwarded step that gave up on `server`; when the server was lost, its
  /// message ends with the line that names what the lost servers of the pair (the owner, and
  /// the buddy once the step failed over) snapshot, as their hellos said, for the trainer's
  /// count of the steps lost (muon_offload/crash_report.py, relay_lost_servers):
  /// "\nsnapshots of the lost servers (JSON): [[endpoint, path, every] or [endpoint], ...]".
  transport::ErrorMsg forward_error(const LinkError& e, int server, const RelayStep& step) const;
  /// `fn` later on the io thread, unless the relay is gone by then.
  void later(std::function<void()> fn);
  int buddy_of(int owner) const;

  RelayConfig config_;
  boost::asio::io_context& io_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // expires with the relay
  std::map<int, std::shared_ptr<PeerLink>> links_;
  std::map<int, uint64_t> link_gen_;  // by server: the generation of links_[server]
  uint64_t next_gen_ = 0;
  std::set<int> lost_;  // servers whose link was lost and not made again since
  std::map<std::string, Subscription> subscriptions_;
  std::map<int, std::vector<transport::RegisterParam>> registered_;  // by plan owner
  /// By server: the step whose forward it last refused a connection to, and why.
  std::map<int, std::pair<int64_t, std::string>> refused_;
  std::map<int, int> targets_;  // plan owner -> the server its parameters go to (absent: itself)
  std::map<int, std::set<int>> moved_;  // server -> owners failed over to it, not registered yet
  /// By server: (--snapshot path, --snapshot-every) as its last hello said.
  std::map<int, std::pair<std::string, int64_t>> snapshots_;
  std::map<Key, Forward> forwards_;
  uint64_t next_forward_ = 0;
  std::map<int, int> owed_;  // by server: forwards not answered yet
  std::map<int, std::vector<std::function<void()>>> fetches_;  // by server: waiting for owed_
};

}  // namespace muon::daemon
