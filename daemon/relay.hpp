// The relay side of the pool (daemon/pool_routes.hpp): a server that relays a parameter for its
// domain sums the domain's contributions as for any parameter (daemon/step_reducer.hpp), then
// forwards that one partial sum to the owner server and hands the owner's update back to its
// domain's ranks. Toward the owner it is a client (client/connection.hpp) that says hello as
// rank transport::relay_rank(world_size, server id), so the owner sums relays after the ranks that
// push to it directly, in server-id order: the step's gradient is, for every element,
//   ((ranks of the owner's domain, ascending) + partial(relay a)) + partial(relay b) ...
// with each partial the sum of its domain's ranks in ascending order: the same for every chunking
// and arrival order (architecture guide, "Equivalence contract").
//
// Failover (docs/design.md, "Failover"): an owner with a buddy (RelayConfig::buddies) that is
// lost is not connected to again: its parameters go to its buddy, which holds their replica
// (daemon/replicator.hpp). They are registered there, and the step in flight is pushed there
// again from the partial sum this relay keeps until an answer comes, so the domain's ranks see
// nothing. When that server is lost in turn, they go back to the owner (restarted meanwhile,
// holding the buddy's replicas).
//
// Threads: the io thread only enqueues. A sender thread connects, registers, pushes and commits
// in the order calls were made (connecting again, and registering every parameter again, after
// a lost owner); one waiter thread per owner takes that owner's answers in the same order and
// posts each outcome to the io thread. Nothing here blocks the io thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/messages.hpp"

namespace muon::client {
class Connection;
}

namespace muon::daemon {

/// How this server reaches the pool (muon-offloadd --pool-servers, --server-id).
struct RelayConfig {
  /// Every server of the plan in id order: Unix socket paths or "tcp://HOST:PORT".
  std::vector<std::string> pool;
  int server_id = 0;   ///< this server's plan id
  int world_size = 1;  ///< compute ranks of the job
  /// Data plane toward an owner on a Unix socket (same host) and over TCP (another host).
  transport::DataPlane local_plane = transport::DataPlane::shm;
  transport::DataPlane remote_plane = transport::DataPlane::shm;
  std::string auth_token;  ///< the pool's token (tcp endpoints)
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
  /// Runs a callback on the io thread (asio::post onto the server's io_context).
  using Post = std::function<void(std::function<void()>)>;

  /// Starts the sender and waiter threads; connects to owners only when first needed.
  /// Throws InvalidArgument when config.server_id is not in config.pool.
  Relay(RelayConfig config, Post post);
  /// Gives every owner connection up (answers still owed fail at once), then stops both threads
  /// after the calls already made (their outcomes are posted; nothing connects again).
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// Registers `reg` (push and want as this relay forwards them) with server `owner`; `done`
  /// runs on the io thread with the owner's RegisterOk, or the error (the owner's refusal, a
  /// timeout naming the ranks it waits for, an unreachable owner: code "peer_lost").
  /// `events` receives on the io thread what the owner says about the parameter outside the
  /// answers to forward(): its errors about steps this relay did not forward (RelayStep with
  /// unasked and error set); for a parameter the domain does not push (reg.push empty) but
  /// wants, each step's update, which the owner sends unasked, and the loss of the owner (step
  /// -1, peer_lost); after a reconnection, the owner's last applied step (resync).
  void register_param(
      int owner, transport::RegisterParam reg,
      std::function<void(std::optional<transport::ErrorMsg>, transport::RegisterOk)> done,
      std::function<void(RelayStep)> events);
  /// Pushes step.grad's push elements to the owner (in step.grad_dtype), commits, and waits for
  /// the update of the want elements; `done` runs on the io thread with `step` filled in.
  void forward(RelayStep step, std::function<void(RelayStep)> done);
  /// Forwards a momentum load chunk (fp32) of parameter `name` (last applied step `step`) to
  /// `owner`; a failure comes back through `failed` on the io thread.
  void forward_momentum(int owner, const std::string& name, int64_t step, int64_t offset,
                        std::vector<float> values, std::function<void(transport::ErrorMsg)> failed);
  /// Fetches the owner's momentum of `name` (numel fp32) after every call made before;
  /// `done(values, last_step, error)` on the io thread.
  void fetch_momentum(
      int owner, const std::string& name, int64_t numel,
      std::function<void(std::vector<float>, int64_t, std::optional<transport::ErrorMsg>)> done);

  /// The endpoint of server `id` ("server 3 (tcp://h:29603)") for messages.
  std::string describe(int id) const;

 private:
  using Task = std::function<void()>;
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> tasks;
    bool stopping = false;
    void push(Task t);
    void run();  // until stopping and empty
  };
  /// The connection to server `server`, made (and every registration of the owners whose
  /// parameters go there replayed) when there is none or it was lost; an existing one first
  /// registers the parameters that failed over to it since. Sender thread only. Throws what
  /// Connection throws.
  std::shared_ptr<client::Connection> connection(int server);
  /// connection(server), connecting within `connect_timeout` when there is none.
  std::shared_ptr<client::Connection> connection(int server,
                                                 std::chrono::milliseconds connect_timeout);
  /// connection(server) for forwarding `step`: within config_.failover_connect_timeout when
  /// the step went there by a failover, or `server` was lost and the owner has a buddy; at once a ConnectionLost when `server` refused a
  /// connection for another parameter's forward of the same step (so a step of P parameters
  /// whose owner and buddy are both lost waits for each connect once, not P times). Sender
  /// thread.
  std::shared_ptr<client::Connection> step_connection(int server, const RelayStep& step);
  /// Registers every parameter of plan owners `owners` on `conn` (to `server`) and posts each
  /// one's last applied step there (resync). Sender thread.
  void register_all(int server, client::Connection& conn, const std::vector<int>& owners);
  /// The server the parameters of plan owner `owner` go to now: the owner, or after a failover
  /// its buddy (and back). Any thread.
  int target_of(int owner);
  /// target_of, after failing over when the connection to it is known lost. Sender thread.
  int resolve(int owner);
  /// Server `from`, which the parameters of `owner` went to, was lost: they go to the other of
  /// the pair (owner, its buddy) from now on. True when they did (or already had: a retry goes
  /// to target_of); false when the owner has no buddy. Any thread.
  bool fail_over(int owner, int from, const std::string& why);
  /// Waits for the update of (step.name, step.step) on `conn` and scatters its want elements
  /// into step.update (numel fp32, zeros elsewhere). Throws what Connection::wait_update throws.
  static void take_update(client::Connection& conn, RelayStep& step);
  /// A forwarded step got its answer (or failed): its errors are no longer awaited.
  void landed(const RelayStep& step);
  /// Installs the callbacks that deliver unasked updates, errors and the owner's loss.
  void watch(const std::shared_ptr<client::Connection>& conn, int owner);
  /// An ErrorMsg for an exception thrown while talking to `owner` about (name, step).
  transport::ErrorMsg error_of(const std::exception& e, int owner, const std::string& name,
                               int64_t step) const;
  /// error_of for a forwarded step that gave up on `server`; when the connection was lost, its
  /// message ends with the line that names what the lost servers of the pair (the owner, and
  /// the buddy once the step failed over) snapshot, as their hellos said, for the trainer's
  /// count of the steps lost (muon_offload/crash_report.py, relay_lost_servers):
  /// "\nsnapshots of the lost servers (JSON): [[endpoint, path, every] or [endpoint], ...]".
  transport::ErrorMsg forward_error(const std::exception& e, int server,
                                    const RelayStep& step);

  RelayConfig config_;
  Post post_;
  std::mutex connections_mu_;  // connections_: written by the sender, abandoned by ~Relay
  std::map<int, std::shared_ptr<client::Connection>> connections_;
  std::set<int> lost_;  // servers whose connection was lost, not made again; connections_mu_
  std::atomic<bool> stopping_{false};  // ~Relay began: connection() refuses to connect
  /// Parameters whose updates the owner sends unasked, by name: a prototype RelayStep (name,
  /// owner, dtypes, numel, want) and where each goes. Read on the connections' reader threads.
  struct Subscription {
    RelayStep prototype;
    std::function<void(RelayStep)> deliver;
    bool unasked_updates = false;  // the domain pushes nothing: the owner sends updates unasked
  };
  std::mutex subscriptions_mu_;  // subscriptions_ and in_flight_
  std::map<std::string, Subscription> subscriptions_;
  std::set<std::pair<std::string, int64_t>> in_flight_;  // forwarded, answer not taken yet
  std::map<int, std::vector<transport::RegisterParam>> registered_;  // by owner; sender thread
  /// By server: the step whose forward it last refused a connection to, and why; sender thread.
  std::map<int, std::pair<int64_t, std::string>> refused_;
  std::mutex targets_mu_;        // targets_, moved_
  std::map<int, int> targets_;   // plan owner -> the server its parameters go to (absent: itself)
  std::map<int, std::set<int>> moved_;  // server -> owners failed over to it, not registered yet
  /// By server: (--snapshot path, --snapshot-every) as its last hello said; under targets_mu_.
  std::map<int, std::pair<std::string, int64_t>> snapshots_;
  Queue sender_;
  std::thread sender_thread_;
  /// One waiter thread per owner: a slow or hung owner delays only its own answers.
  struct Waiter {
    Queue queue;
    std::thread thread;
  };
  /// The waiter of `owner` (started on first use; any thread).
  Queue& waiter(int owner);
  std::mutex waiters_mu_;  // waiters_, waiters_stopping_
  std::map<int, std::unique_ptr<Waiter>> waiters_;
  bool waiters_stopping_ = false;
};

}  // namespace muon::daemon
