// The server's state machine over parameters and steps: registration across ranks, the step
// reduction, hand-off to the Newton-Schulz worker, update fan-out to subscribers, failure
// handling (lost ranks, timeouts, bad input) and snapshots. Runs on the io thread only; the
// worker's results are posted back to it.
//
// The member functions live by stage (the data flows top to bottom):
//   ingress/dispatch.cpp   on_frame and the mapping of exceptions to error codes
//   ingress/hello.cpp      hello: token, world size, the session's data plane (planes/)
//   registry/registry.cpp  registration and re-registration
//   registry/forget.cpp    forgetting the parameters of jobs long gone
//   ingress/push.cpp       push and commit frames into the step's reducer
//   step/engine_steps.cpp  per-parameter phases (step/param_state.hpp), timers, lost ranks,
//                          the results coming back
//   step/owned_role.cpp    a parameter owned here: momentum, the hand-off to the worker
//   step/relayed_role.cpp  a parameter relayed for the domain: registration with the owner, the
//                          hand-off of the partial sum to it, momentum loads and fetches there
//   egress/egress.cpp      updates and momentum cut into chunks for each rank
//   state/state.cpp        snapshots, state fetches, momentum loads
//   observe/observe.cpp    status, metrics refresh, the numeric-health policy call site
//   engine.cpp             construction, the relay, shutdown
//
// Step rules: a parameter's steps are explicit integers; the first step after registration (or
// restore) may be any number, later ones must follow the last applied step by exactly one. A step
// whose Newton-Schulz is refused (non-finite gradient under policy `error`) is consumed: momentum
// untouched, every rank of the parameter gets the error, and the next step is last + 1.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/completion_queue.hpp"
#include "daemon/device_plane.hpp"
#include "daemon/metrics.hpp"
#include "daemon/pool_routes.hpp"
#include "daemon/registration.hpp"
#include "daemon/pool/relay.hpp"
#include "daemon/replica_store.hpp"
#include "daemon/pool/replicator.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/server_config.hpp"
#include "daemon/session.hpp"
#include "daemon/snapshot.hpp"
#include "daemon/snapshot_writer.hpp"
#include "daemon/step/param_state.hpp"
#include "daemon/step_reducer.hpp"

namespace muon::daemon {

class Engine {
 public:
  using SessionPtr = std::shared_ptr<Session>;

  /// Restores momentum from config.restore_path when set (throws muon::InvalidArgument for a
  /// bad snapshot) and reads config.plan_path when set (InvalidArgument for a bad plan, a
  /// server id it lacks, or pool_servers that do not list its servers while it has this server
  /// relay parameters). `backend` runs on the worker thread.
  Engine(boost::asio::io_context& io, ServerConfig config, std::unique_ptr<Backend> backend);
  ~Engine();

  void on_frame(const SessionPtr& session, transport::Frame frame);
  void on_closed(const SessionPtr& session, const std::string& why);
  void add_session(const SessionPtr& session);

  /// Stops taking steps, waits for the Newton-Schulz work in flight, writes the final snapshot
  /// (when configured), closes every session and stops the worker; then calls `done` on the io
  /// thread. `why` ("signal SIGTERM", "stop requested") goes into every error the ranks get.
  void shutdown(const std::string& why, std::function<void()> done);

  /// Readable state for `status` (JSON text): server version, uptime, world size, sessions
  /// (rank, client, pending chunks, last step report), parameters (shape, last step,
  /// contributors, the step being gathered and its missing ranks, computing, last numeric-health
  /// sample), the scheduler queue, errors by code, the last snapshot (path, unix time, age) and
  /// the metrics endpoint.
  std::string status_json() const;

  /// The server's metrics; refresh_metrics() sets their state gauges (call before rendering).
  Metrics& metrics() { return metrics_; }
  void refresh_metrics();
  /// Open TCP sessions that have not said a valid hello yet.
  size_t pre_hello_tcp_sessions() const;
  /// The token TCP sessions must send in their hello (set by the Server from --auth-token-file).
  void set_auth_token(std::string token) { config_.auth_token = std::move(token); }
  /// Where the metrics endpoint listens (for status), "" when there is none.
  void set_metrics_url(std::string url) { metrics_url_ = std::move(url); }

 private:
  using Param = ParamState;
  // The parameter roles (step/parameter_role.hpp) are parts of the Engine on its io thread.
  friend class OwnedRole;
  friend class RelayedRole;

  void on_hello(const SessionPtr& s, const transport::Frame& f);
  /// The session's data plane as its hello asks: a shared-memory segment, exported device
  /// rings (cuda_ipc) or NCCL communicators being joined (nccl); fills `ok`. Replies the error
  /// and returns false when this server cannot serve that plane.
  bool open_data_plane(const SessionPtr& s, const transport::Hello& m, transport::HelloOk& ok,
                       uint32_t request_id);
  void on_register(const SessionPtr& s, const transport::Frame& f);
  /// on_register's work for the decoded `m`; throws InvalidArgument for a registration it
  /// refuses (on_register answers it, naming the parameter).
  void register_param(const SessionPtr& s, const transport::Frame& f,
                      const transport::RegisterParam& m);
  void on_push(const SessionPtr& s, const transport::Frame& f);
  void on_commit(const SessionPtr& s, const transport::Frame& f);
  void on_snapshot(const SessionPtr& s, const transport::Frame& f);
  void on_state_fetch(const SessionPtr& s, const transport::Frame& f);
  /// Whether a state fetch of `p` expecting `after_step` must wait: a step is computing or
  /// replicating (the worker owns the momentum), or the parameter has not reached the step.
  bool fetch_must_wait(const Param& p, int64_t after_step) const;
  /// Answers a state fetch now: the momentum, or an error named after the parameter.
  void answer_fetch(const SessionPtr& s, const std::string& name, uint32_t request_id);
  /// Answers the held fetches that need not wait any more (after a step ends or is dropped).
  void release_fetches();
  void on_step_report(const SessionPtr& s, const transport::Frame& f);
  /// Momentum loading (a push of kind momentum). Throws InvalidArgument while a step is open.
  void load_momentum(const transport::Push& m, Param& p, std::span<const float> values);
  /// Throws InvalidArgument when a gradient push of m.step does not follow the parameter's steps
  /// (StepMachine::check_step).
  void check_gradient_step(const transport::Push& m, const Param& p) const;
  /// The open step's reducer, opened on the step's first chunk (phase gathering); null (after
  /// replying peer_lost to `s`) when a contributor is lost.
  StepReducer* start_gathering(const SessionPtr& s, const transport::Push& m, Param& p);
  /// Refreshes p.momentum (the host copy of the momentum) from the device on the GPU data
  /// plane, then calls `then` (at once on the host path; from completions_ on the device, and
  /// only while p is registered with the same storage: else never). A failed copy is logged
  /// and counted, and `then` gets false (the copy is then stale).
  void with_host_momentum(const std::string& name, Param& p,
                          std::function<void(Param&, bool fresh)> then);
  /// The host copy of a parameter's momentum, refreshed and waited for: only where the io
  /// thread may wait for its own device work (shutdown's final snapshot, an unregistration that
  /// keeps the momentum). Throws DeviceError.
  const std::vector<float>& host_momentum_now(Param& p);
  /// Polls completions_ every CompletionQueue::kPoll while it holds waits.
  void poll_completions();
  /// Counts the error in the metrics and sends it to `s`.
  void reply_error(const SessionPtr& s, const transport::ErrorMsg& error, uint32_t request_id = 0);
  void observe_health(const std::string& name, Param& p, const NsJob& job);
  /// The orthogonality error above which a sample warns: --health-warn-threshold when given,
  /// else the sample's own threshold (daemon/numeric_health.hpp).
  double health_limit(const NumericHealth& h) const;

  Param& registered_param(const std::string& name, const SessionPtr& s);
  void complete_registration(const std::string& name, Param& p);
  /// The first registration `m` (from `rank`, with `spec`) of a parameter owned here whose
  /// replica this server holds (its owner was lost, or it comes back to its restarted owner):
  /// when the replica names the owner's registrants (the same as here, `rank` with the ranges
  /// of `m`), the others are added to p.pending with the ranges they had there, so that the
  /// registration is complete with `m`. Their own registrations then answer as re-registrations.
  void registrants_from_replica(Param& p, const ParameterSpec& spec, int rank,
                                const transport::RegisterParam& m);
  /// A registration `m` of a registered parameter from another job, or from its job restarted
  /// at another world size: once no compute rank of the parameter's job is connected, forgets
  /// the parameter so that `m` registers it anew: fresh, or (the same job, or m.resume) keeping
  /// momentum and last step through restored_, as a restored snapshot's. Throws InvalidArgument
  /// while a rank of that job is connected or a step of it is in flight.
  void hand_over(const transport::RegisterParam& m, const SessionPtr& s);
  void release_reregistrations(Param& p);
  /// Sends register_ok (contributors, last applied step) to every rank waiting for it.
  void answer_registration(Param& p);

  void start_compute(const std::string& name, Param& p);
  /// An owned step came back from the worker: its update (or error) to the parameter's ranks,
  /// its buffers back to the parameter.
  void release_step(Param& p, NsJob& job);
  // ---- replication (daemon/pool/replicator.hpp, daemon/replica_store.hpp) ------------------------
  /// Where an owned parameter's state is replicated: its plan owner's buddy when this server is
  /// the owner, the owner when this server is the buddy that took it over; -1 when replication
  /// is off (--replicate off), the plan names no buddy, or the parameter is not in the plan.
  int replica_target(const std::string& name) const;
  /// Streams p's momentum (and `update`, numel fp32, unless null) as the state after `step` with
  /// `outcome` (Replica::outcome) to `target`, then runs release(p) on the io thread (when the
  /// buddy answered or failed: a failure warns, and the update goes out unreplicated). The
  /// buffers must not change until then (the phase holds the steps back).
  void replicate_then(const std::string& name, Param& p, int target, int64_t step,
                      const std::string& outcome, const float* update,
                      std::function<void(Param&)> release);
  /// The replicator toward the buddies (made on first use).
  Replicator& replicator();
  /// A replication to `target` ended with `error` ("" none): warns once when it goes down, says
  /// so when it is back.
  void note_buddy(int target, const std::string& error);
  /// A replica session's frames: chunks of replica kinds, and seals (register_param replica).
  void on_replica_push(const SessionPtr& s, const transport::Push& m, std::span<const float> values);
  void on_replica_seal(const SessionPtr& s, const transport::RegisterParam& m, uint32_t request_id);
  /// The session is an owner's replica session (transport::replica_rank).
  bool is_replica_session(const Session& s) const;
  /// A taken-over parameter's step whose update its owner may have sent to some ranks before it
  /// was lost: true when `step` is p's replayed step (a rank pushing it again gets the
  /// replica's update at its commit, nothing is summed).
  bool replaying(const Param& p, int64_t step) const;
  /// The replayed step's update (or its refusal) to the session of `s` only.
  void send_replay(const std::string& name, Param& p, const SessionPtr& s);
  /// A relayed step came back from the owner (update or error): returns it to the domain's ranks.
  void finish_relayed(RelayStep step);
  void finish_jobs(std::vector<NsJob> jobs);
  /// send_update of job's update (first written into the device buffer when `upload`: an update
  /// that came from the owner); a failed CUDA copy goes to the parameter's ranks as a backend
  /// error and the server keeps serving.
  void return_update(Param& p, NsJob& job, bool upload, int only_rank = -1);
  /// After steps finished: answers snapshot requests that waited for them, and a shutdown.
  void after_steps();
  /// A parameter's storage: on the GPU data plane when there is one, else host memory.
  std::unique_ptr<ParamStorage> make_storage(int64_t numel, bool momentum);
  /// The relay toward owners (made on first use).
  Relay& relay();
  /// How this server reaches another server of the pool (relays to owners, replicas to
  /// buddies): over NCCL from a GPU server, else over shared memory (the same host; a CPU pool
  /// across hosts has no data plane between them).
  transport::DataPlane peer_plane() const;
  /// This server's place in the pool, as the relay and the replicator reach it.
  PoolPeers pool_peers() const;
  /// Sends `n` fp32 momentum values (last applied step `last_step`) to `s` as state_fetch data.
  void send_momentum(const SessionPtr& s, const std::string& name, int64_t last_step,
                     const float* values, int64_t n);
  /// "rank 3", or "relay server 1" for a relay's rank.
  std::string rank_name(int rank) const;
  /// The update of `job` to every rank that wants some of it, in slot-size chunks (a packed
  /// registration's want ranges laid end to end); on the GPU data plane device to device where
  /// the session's plane takes that, else from host bytes read back without waiting (the
  /// chunks then go out from completions_). `only_rank` >= 0: to that rank only (a replayed
  /// step). Throws DeviceError (enqueueing a copy).
  void send_update(const std::string& name, Param& p, NsJob& job, int only_rank = -1);
  /// A step's update could not be returned (a CUDA copy failed): logged, counted, and the
  /// error sent to the parameter's ranks; the server keeps serving.
  void return_failed(const Param& p, const std::string& name, int64_t step,
                     const std::string& what);
  /// A step the machine dropped (timeout, lost rank, shutdown): logged, counted, its timer
  /// cancelled, the error sent to the parameter's ranks but `except_rank`.
  void report_dropped(Param& p, const transport::ErrorMsg& error, int except_rank);
  /// Arms p.timer at the machine's deadline (none: nothing); on expiry the machine says what
  /// timed out.
  void arm_timer(const std::string& name, Param& p);
  void broadcast(const Param& p, const transport::ErrorMsg& error, int except_rank = -1);
  /// A compute rank's connection broke without a goodbye: tells every other compute rank of its
  /// job now (peer_lost naming it, no parameter), whatever they are doing, and logs it.
  void tell_lost(const SessionPtr& lost, const std::string& what);
  SessionPtr session_of(int rank) const;
  bool any_computing() const;
  /// A copy of the momentum of every parameter whose momentum is kept here (registered, owned),
  /// handed to `then` once every one is in host memory (at once on the host path; from
  /// completions_ on the GPU data plane); `complete` is false when a copy failed.
  void snapshot_entries(std::function<void(std::vector<SnapshotEntry>, bool complete)> then);
  /// Writes a requested snapshot to `path` on the writer thread, then answers `s` (snapshot_ok,
  /// or the error). Warns when the parameters' steps differ (a snapshot taken mid-step).
  void request_snapshot(const SessionPtr& s, const std::string& path, uint32_t request_id);
  void write_requested_snapshot(const std::weak_ptr<Session>& s, const std::string& path,
                                uint32_t request_id, std::vector<SnapshotEntry> entries);
  /// With --snapshot-every N: keeps a copy of p's momentum when p has applied step S with
  /// (S + 1) % N == 0, and hands the set to the writer once every owned parameter has S.
  void collect_periodic(const std::string& name, Param& p);
  /// Hands the periodic set to the writer once it holds every owned parameter.
  void write_periodic_when_complete();
  /// The final snapshot of a shutdown (synchronous, after the writer's queue): skipped, with a
  /// warning, when the steps are mixed and this server wrote a snapshot of one step there.
  void write_final_snapshot();
  void maybe_finish_shutdown();
  // ---- forgetting finished jobs (registry/forget.cpp) ---------------------------------------------
  /// With --forget-finished-jobs-after: arms forget_timer_ for the next sweep.
  void schedule_forgetting();
  /// One sweep: the owned parameters, idle, of a job none of whose sessions (compute ranks, or
  /// a relay that registered for it) has been connected for config_.forget_after are erased
  /// (logged, counted); the memory goes back to the system. Returns how many.
  size_t forget_finished_jobs(std::chrono::steady_clock::time_point now);
  /// A session of `job` registered (`present`: the job is back, nothing of it goes) or closed
  /// (its delay counts from now, however short its stay was); with forgetting on only.
  void note_job_session(const std::string& job, bool present);

  boost::asio::io_context& io_;
  ServerConfig config_;
  /// The GPU data plane; null on the host path (CPU backend, or --host-staging).
  std::unique_ptr<DevicePlane> device_;
  /// The device copies to the host that the io thread does not wait for (param_storage.hpp),
  /// polled by completion_timer_; after device_, so its waits go before the plane.
  CompletionQueue completions_{[this] { poll_completions(); }};
  boost::asio::steady_timer completion_timer_{io_};
  bool completion_polling_ = false;
  Metrics metrics_;  // before scheduler_: built from the backend's name before it moves there
  Scheduler scheduler_;
  std::map<std::string, Param> params_;
  std::map<std::string, SnapshotEntry> restored_;
  std::map<int, std::weak_ptr<Session>> ranks_;
  /// Ranks whose connection broke without a goodbye; cleared when the rank says hello again.
  /// A step that needs one of them fails at once instead of waiting for the step timeout.
  std::map<int, std::string> lost_ranks_;
  std::map<uint64_t, std::weak_ptr<Session>> sessions_;
  int world_size_ = 0;
  std::vector<std::pair<std::weak_ptr<Session>, std::pair<std::string, uint32_t>>>
      snapshot_waiters_;
  /// State fetches waiting for their parameter's step (fetch_must_wait), by arrival; each
  /// answered at the latest after the step timeout (its timer).
  struct HeldFetch {
    std::weak_ptr<Session> session;
    std::string name;
    int64_t after_step = -1;
    uint32_t request_id = 0;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  std::map<uint64_t, HeldFetch> held_fetches_;
  /// Takes the held fetch `it` out (its timer with it) and answers it unless its session is
  /// gone; returns the next one.
  std::map<uint64_t, HeldFetch>::iterator answer_held(std::map<uint64_t, HeldFetch>::iterator it);
  uint64_t next_fetch_ = 0;
  std::vector<float> scratch_;  // fp32 values of momentum and replica pushes, read out of a slot
  std::map<uint64_t, transport::StepReport> reports_;  // last step report, by session id
  /// A periodic snapshot being collected: the step, the copies of the parameters that have it.
  struct PeriodicSnapshot {
    int64_t step = -1;
    std::vector<SnapshotEntry> entries;
    double copy_seconds = 0;  ///< io thread time spent copying the momenta so far
  };
  std::optional<PeriodicSnapshot> periodic_;
  /// Periodic snapshots skipped because the writer was behind (warned about once).
  int64_t skipped_periodic_ = 0;
  int64_t skipped_step_ = -1;  ///< the last step whose periodic snapshot was skipped
  std::string last_snapshot_path_;
  std::optional<std::chrono::system_clock::time_point> last_snapshot_time_;
  std::string metrics_url_;
  bool stopping_ = false;
  /// Expires with the Engine: callbacks of threads that may outlive it check it first.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::function<void()> shutdown_done_;
  std::string shutdown_why_;  // "server shutting down (signal SIGTERM)": what the ranks are told
  boost::asio::steady_timer forget_timer_{io_};
  /// Jobs whose parameters are held here but none of whose sessions is connected: since when.
  std::map<std::string, std::chrono::steady_clock::time_point> job_left_;
  bool forget_announced_ = false;
  std::optional<PoolRoutes> routes_;  // the plan's routes (config_.plan_path)
  std::unique_ptr<Relay> relay_;      // toward the owners of relayed parameters
  /// Replicas of the parameters whose owner's buddy this server is (or whose takeover owner
  /// replicates back to it).
  ReplicaStore replicas_;
  std::map<int, bool> buddy_down_;  // by buddy id: the last replication to it failed
  /// Toward the buddies; destroyed before params_ (its thread reads their buffers).
  std::unique_ptr<Replicator> replicator_;
  /// Writes snapshots off the io thread; last member: destroyed (joined) first.
  std::unique_ptr<SnapshotWriter> writer_;
};

}  // namespace muon::daemon
