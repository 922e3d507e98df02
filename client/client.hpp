// The client library linked into trainers: connects a compute rank to one or more muon-offloadd
// servers, registers parameters with their owner server, pushes gradient chunks during backward
// and receives orthogonalized updates. Compute ranks keep no momentum and run no Newton-Schulz.
//
// Typical step on rank r:
//   for each gradient as autograd produces it:  push(name, step, offset, data, count); commit(...)
//   at optimizer.step():                         wait_update(name, step, dst) for each parameter
//   once every update is in hand:                report_step(step)
//
// Servers: Unix socket paths, or "tcp://HOST:PORT" for a server on another node (its control
// plane; the token of ClientConfig::auth_token or MUON_OFFLOAD_TOKEN_FILE proves the client).
//
// Data plane (ClientConfig::data_plane): `shm` (host shared memory, a server on this node),
// `cuda_ipc` (the server's device rings on the same node, a server on the CUDA backend) or `nccl`
// (NCCL point-to-point with a CUDA server, e.g. on another node): gradients go from the trainer's
// device memory into the server's GPU with no host staging (push_device) and updates come back
// into device memory (wait_update_device). The host calls work on every plane, the device calls
// too (on shm they stage through host memory).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/connection.hpp"
#include "kernels/device_stream.hpp"
#include "kernels/muon_options.hpp"
#include "transport/messages.hpp"

namespace muon::client {

struct ClientConfig {
  /// Endpoints of the servers (the job's pool as the plan lists it, or one server): Unix socket
  /// paths, or "tcp://HOST:PORT" (HOST a name, an IPv4 address or a bracketed IPv6 address).
  std::vector<std::string> servers;
  int rank = 0;        ///< this compute rank
  int world_size = 1;  ///< compute ranks of the job
  std::string name;    ///< for the server's logs
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds op_timeout{120000};
  /// How gradient and update bytes move, for every server: shm (host shared memory) or cuda_ipc
  /// (the server's device rings, opened on the CUDA device current when the Client is created or
  /// reconnects: make the trainer's device current first, cudaSetDevice / torch.cuda.set_device).
  /// A server that cannot serve cuda_ipc (CPU backend) refuses the connection: ServerError with
  /// code "unsupported" and the server's reason.
  /// nccl: joins the session's two NCCL communicators on the device current when the Client is
  /// created (same rule), waiting up to op_timeout; needs a client built with NCCL
  /// (BackendUnavailable otherwise, before connecting) and a server on the CUDA backend built
  /// with NCCL, on another GPU than the client's (NCCL refuses two ranks on one GPU).
  transport::DataPlane data_plane = transport::DataPlane::shm;
  /// The data plane of tcp:// endpoints (servers on other nodes, where shm and cuda_ipc cannot
  /// reach): when unset, $MUON_OFFLOAD_REMOTE_DATA_PLANE ("nccl" as the launcher sets it for a
  /// plan spanning hosts), else `data_plane`.
  std::optional<transport::DataPlane> remote_data_plane;
  /// The servers' shared secret (muon-offloadd --auth-token-file), sent in the hello on tcp
  /// endpoints only. Empty: read from the file named by MUON_OFFLOAD_TOKEN_FILE when a tcp
  /// endpoint is configured (client/auth_token_source.hpp). A tcp server refuses a hello without
  /// its token: ServerError with code "unauthorized".
  std::string auth_token;
  /// When to connect to a server: false, at construction (every server); true, when a
  /// parameter it owns is first registered (or snapshot/health names it), so that a rank opens
  /// connections only to the servers its parameters use. Unset: true when
  /// $MUON_OFFLOAD_SERVERS_SCOPE is "global" (the launcher sets it for a plan spanning hosts:
  /// the list is then every server of the plan, and a rank that pushes to its domain's relay
  /// would otherwise hold N x S connections, with NCCL two communicators each), else false.
  /// A server that cannot be reached then fails the registration that needs it (ConnectionLost
  /// naming the endpoint), not the construction; cuda_ipc and nccl connections open on the
  /// CUDA device current at that registration.
  std::optional<bool> connect_on_first_use;
  /// The training job this rank belongs to: the same string on every rank of the job (e.g. a
  /// UUID that rank 0 makes and broadcasts), sent with each registration (at most 256 bytes).
  /// A server that holds a parameter of another job registers it anew for this one once none of
  /// that job's ranks is connected: fresh (momentum and step dropped) or, with `resume`, keeping
  /// the momentum and last step the other job left. While a rank of that job is connected the
  /// registration is refused (ServerError bad_request naming it). Empty: no identity; the
  /// server keeps a parameter's state by name across jobs (the same name goes on at its step).
  std::string job;
  /// With `job`: adopt the state another job left under the same names instead of starting
  /// fresh (a job restarted with a new identity, e.g. after a crash or at another world size).
  bool resume = false;
};

/// One parameter as this rank registers it.
struct ParameterRegistration {
  std::string name;
  std::vector<int64_t> shape;  ///< global shape [r, c] or [b, r, c]
  transport::DType grad_dtype = transport::DType::f32;
  transport::DType update_dtype = transport::DType::f32;
  MuonOptions options;
  std::vector<transport::Range> push;  ///< elements this rank contributes
  std::vector<transport::Range> want;  ///< elements of the update this rank receives
  int server = 0;                      ///< owner server: index into ClientConfig::servers
};

/// The register_param message of `p` as it stands alone: unpacked, no job, not resuming (the
/// Client adds its job, its resume flag and packing; tests send it by hand).
transport::RegisterParam register_message(const ParameterRegistration& p);

/// What this rank saw of one optimizer step: the figures accumulated since the previous
/// report_step (or since the client was created).
struct StepStats {
  int64_t step = -1;              ///< the label given to report_step
  double exposed_wait_s = 0.0;    ///< seconds spent blocked in wait_update
  int64_t bytes_pushed = 0;       ///< gradient bytes pushed (grad dtype)
  /// Push frames sent (each one ring slot of gradient bytes): a column block pushed with
  /// push_packed is one frame when it fits a slot, where push() of its rows makes one a row.
  int64_t push_frames = 0;
  int parameters = 0;             ///< updates taken by wait_update
  std::string slowest_parameter;  ///< of those, the one whose update arrived last ("" if none)
};

class Client {
 public:
  /// Connects to every server. Throws InvalidArgument (a malformed endpoint, an unreadable token
  /// file); ConnectionLost naming the unreachable server; ServerError when a server refuses the
  /// hello (code "unsupported": the data plane; "unauthorized": a missing or wrong token on a tcp
  /// endpoint); BackendUnavailable / DeviceError when the device plane cannot be set up here
  /// (built without CUDA or NCCL, no usable GPU, NCCL refuses to join).
  explicit Client(ClientConfig config);
  ~Client();

  /// Registers parameters with their owner servers and waits until every rank of the job has
  /// registered them (the server answers then). A server whose connection was lost is connected
  /// to again first (a new session: register every parameter it serves again, as a failover to
  /// the owner's buddy and back does, or call reconnect()). Throws InvalidArgument (bad server
  /// index), ServerError (refused: the message names the parameter and the reason), Timeout
  /// (other ranks did not register; the message names them), ConnectionLost.
  void register_parameters(const std::vector<ParameterRegistration>& params);

  /// Sets ClientConfig::job and resume for the registrations from now on (those already made
  /// keep theirs). InvalidArgument for a job longer than 256 bytes.
  void set_job(std::string job, bool resume);

  /// Pushes `count` elements (grad dtype) at element `offset` of the parameter for `step`.
  /// Several pushes of the same elements in one step accumulate on the server. Returns once the
  /// data sits in shared memory.
  void push(const std::string& name, int64_t step, int64_t offset, const void* data, int64_t count);
  /// Pushes `count` elements (grad dtype) at packed position `packed` of this rank's push ranges
  /// sorted and laid end to end (what a sharded rank holds: a DTensor's local tensor is its push
  /// ranges packed): one push for a column block (a row range x a column range), however many
  /// ranges its rows are, chunked only by the slot size; the server scatters it into the matrix
  /// (transport::RegisterParam::packed). Several pushes of the same elements in one step
  /// accumulate, as push(). Throws InvalidArgument (naming the span) when [packed, packed +
  /// count) is not inside the rank's push elements; nothing is pushed then.
  void push_packed(const std::string& name, int64_t step, int64_t packed, const void* data,
                   int64_t count);
  /// push_packed from CUDA device memory, as push_device (same streams, lifetimes and errors).
  void push_packed_device(const std::string& name, int64_t step, int64_t packed,
                          const void* device_data, int64_t count, StreamHandle stream);
  /// push from CUDA device memory: `device_data` holds `count` elements (grad dtype) on the
  /// device current at connection (cuda_ipc, nccl) or any device (shm). cuda_ipc: each chunk is
  /// copied straight into the server's GPU ring (nccl: sent with ncclSend) on the connection's
  /// push stream (push_stream(name)), ordered after the work already on `stream` (e.g. the
  /// backward that produced the gradient); `stream` itself waits for nothing of the server's
  /// (gpu-review F10). `stream` must belong to that device (InvalidArgument naming both devices
  /// otherwise); returns once the copies are enqueued, so the caller must keep `device_data`
  /// alive and unchanged until the push stream has passed them: work queued on `stream` after
  /// the wait_update_device of this step is (the update is computed from them); a caching
  /// allocator is told by recording the buffer on push_stream(name). shm: copies to host on
  /// `stream`, waits for it, then pushes as push() does. `stream` is a cudaStream_t (nullptr: the
  /// legacy default stream). Counted in bytes_pushed like push. Throws InvalidArgument (elements
  /// outside the push ranges, `device_data` not device memory), DeviceError (CUDA fails, e.g. no
  /// usable GPU), BackendUnavailable (built without CUDA), and what push throws; a throw before
  /// anything was announced leaves the connection usable.
  void push_device(const std::string& name, int64_t step, int64_t offset, const void* device_data,
                   int64_t count, StreamHandle stream);
  /// The stream push_device of `name` copies (sends) on: a cudaStream_t of the connection to the
  /// parameter's server (connected on first use), nullptr on shm (push_device has finished
  /// reading when it returns). Throws what owner lookup throws (an unknown parameter).
  StreamHandle push_stream(const std::string& name);
  /// Declares this rank's contribution to (name, step) complete; the server starts the step once
  /// every contributor committed. A rank that registered no push ranges for `name` (an empty
  /// shard) contributes nothing: it need not commit, and a commit from it is ignored by the
  /// server (before or after the others pushed), so a loop may commit every parameter it holds.
  void commit(const std::string& name, int64_t step);
  /// Waits until every server has taken all pushed data out of shared memory.
  void flush();
  /// Waits for the update of (name, step) and copies the packed want ranges (update dtype) to
  /// dst. Returns false when the server skipped the step (non-finite policy skip; dst zeroed).
  bool wait_update(const std::string& name, int64_t step, void* dst);
  /// wait_update into CUDA device memory: `device_dst` receives the packed want ranges (want
  /// elements x update dtype bytes). cuda_ipc / nccl: the update was already copied out of the
  /// ring (received with ncclRecv) into a client-owned device buffer on the connection's reader
  /// stream; `stream` is made to wait for
  /// that copy, then copies into `device_dst` (device to device); returns once enqueued: the
  /// values are there for work queued on `stream` after this call. shm: waits on the host, then
  /// copies to `device_dst` on `stream` and waits for it. Returns false when the server skipped
  /// the step (zeros). Throws what wait_update throws, plus InvalidArgument (`device_dst` not
  /// device memory), DeviceError, BackendUnavailable; those three leave the update held, so a
  /// later wait_update of the same step still gets it.
  bool wait_update_device(const std::string& name, int64_t step, void* device_dst,
                          StreamHandle stream);
  bool update_ready(const std::string& name, int64_t step);
  /// Where the update of (name, step) stands (Connection::update_state). Never waits.
  UpdateState update_state(const std::string& name, int64_t step);
  /// Calls `cb(name, step)` on a client thread as each update completes (once per parameter and
  /// step; it may run just before or just after a wait_update of the same step returns). The
  /// callback must not block on the client.
  void set_update_callback(UpdateCallback cb);

  /// The server-held fp32 momentum of a parameter (all elements) and its last applied step;
  /// with after_step >= 0, once the step has reached it (transport::StateFetch::after_step).
  std::vector<float> fetch_momentum(const std::string& name, int64_t* last_step = nullptr,
                                    int64_t after_step = -1);
  /// Loads momentum into the server (for state_dict loading); `step` is its last applied step.
  void load_momentum(const std::string& name, int64_t step, const float* values);
  /// Asks server `server` to snapshot to `path` (empty: its configured path); returns the path.
  std::string snapshot(int server = 0, const std::string& path = "");
  /// Health of server `server`.
  transport::HealthOk health(int server = 0);

  /// Closes the current step: sends a `step_report` (exposed wait, bytes pushed, parameters,
  /// slowest parameter) to every server, where it feeds muon_offload_client_exposed_wait_seconds
  /// and `muon-offload status`, and returns the figures; the next step's figures start at zero.
  /// `step` is a label (the optimizer's step). Throws ConnectionLost.
  StepStats report_step(int64_t step);
  /// The figures of the last report_step (step -1 before the first).
  const StepStats& last_step_stats() const { return last_stats_; }

  /// The first rank of this job a server reported lost (Connection::lost_peers, over the open
  /// connections; the lowest rank), with the server's message; nullopt when none was.
  std::optional<std::pair<int, std::string>> lost_peer();

  /// What server `server` keeps through a crash, as its hello said (Connection::snapshot_config),
  /// and whether the connection to it was lost; nullopt config when it is not connected or did
  /// not say. Throws InvalidArgument for a server index out of range.
  struct ServerSurvival {
    bool lost = false;
    std::optional<std::pair<std::string, int64_t>> snapshot;  ///< path, every
  };
  ServerSurvival survival(int server);

  /// Drops every connection, reconnects (with the connect timeout) and registers every
  /// parameter again — for a server that restarted from its snapshot.
  void reconnect();

  const ClientConfig& config() const { return config_; }
  /// The registration of a parameter. Throws InvalidArgument for an unknown name.
  const ParameterRegistration& registration(const std::string& name) const;

 private:
  Connection& owner(const std::string& name);
  /// Cuts [offset, offset + count) at the parameter's push ranges and calls piece(element,
  /// packed position, elements) for each piece, counting its bytes as pushed; InvalidArgument
  /// (naming the element) for elements outside every push range.
  void for_each_piece(const std::string& name, int64_t offset, int64_t count,
                      const std::function<void(int64_t, int64_t, int64_t)>& piece);
  /// The push ranges of a registered parameter, sorted, with their packed positions (every
  /// registration is packed: chunks are addressed by packed position).
  const RangeSet& push_set(const std::string& name);
  /// Checks that [packed, packed + count) lies in the rank's packed push elements and counts its
  /// bytes as pushed; InvalidArgument naming the span otherwise.
  void check_packed(const std::string& name, int64_t packed, int64_t count);
  /// Runs wait(connection) with the exposed-wait and slowest-parameter accounting of wait_update.
  bool timed_wait(const std::string& name, int64_t step,
                  const std::function<bool(Connection&)>& wait);
  /// Bytes of the packed want ranges of a parameter (update dtype).
  size_t want_bytes(const ParameterRegistration& reg) const;
  /// Opens the connection to server `i` (an index into config_.servers) if it is not open.
  Connection& connection(size_t i);
  /// A new connection to server `i` (a new session), its update callback installed. Throws
  /// what the Connection constructor throws.
  std::unique_ptr<Connection> connect(size_t i);
  /// connection(i), opened anew (a new session) when the one there was lost: a registration
  /// goes to a server that restarted, or to the other of an owner and its buddy after a
  /// failover (docs/design.md, "Failover").
  Connection& live_connection(size_t i);
  /// The connection to server `i` was lost and serves no registered parameter any more (they
  /// were all registered with another server since: a failover): step reports and flushes
  /// leave it out.
  bool left_behind(size_t i) const;
  /// Whether connections open on first use (ClientConfig::connect_on_first_use, resolved).
  bool lazy_ = false;
  /// The hello's token and the data plane of tcp endpoints, resolved at construction and at
  /// each reconnect() (a token file may have been rewritten meanwhile).
  void resolve_endpoint_settings();
  std::string token_;
  std::optional<transport::DataPlane> remote_;
  /// Installed on every connection: records when each update completed, then calls callback_.
  void on_update_complete(const std::string& name, int64_t step);
  ClientConfig config_;
  /// One slot per configured server; null until connected (lazy_) — the caller's thread
  /// only creates them, the reader threads never touch the vector.
  std::vector<std::unique_ptr<Connection>> connections_;
  std::map<std::string, ParameterRegistration> params_;
  std::map<std::string, RangeSet> push_sets_;  // push_set(), made on first use

  std::mutex callback_mu_;  // callback_ and arrivals_ (read by the connections' reader threads)
  UpdateCallback callback_;
  /// When each (parameter, step) update completed, until wait_update takes it.
  std::map<std::pair<std::string, int64_t>, std::chrono::steady_clock::time_point> arrivals_;

  // The step being measured (caller's thread only, like every call but the callback).
  StepStats window_;
  std::chrono::steady_clock::time_point latest_arrival_{};
  StepStats last_stats_;
};

}  // namespace muon::client
