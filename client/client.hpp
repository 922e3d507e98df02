// The client library linked into trainers: connects a compute rank to one or more muon-offloadd
// servers, registers parameters with their owner server, pushes gradient chunks during backward
// and receives orthogonalized updates. Compute ranks keep no momentum and run no Newton-Schulz.
//
// Typical step on rank r:
//   for each gradient as autograd produces it:  push(name, step, offset, data, count); commit(...)
//   at optimizer.step():                         wait_update(name, step, dst) for each parameter
//   once every update is in hand:                report_step(step)
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/connection.hpp"
#include "kernels/muon_options.hpp"
#include "transport/messages.hpp"

namespace muon::client {

struct ClientConfig {
  /// Socket paths of the servers (the job's pool as the plan lists it, or one server).
  std::vector<std::string> servers;
  int rank = 0;        ///< this compute rank
  int world_size = 1;  ///< compute ranks of the job
  std::string name;    ///< for the server's logs
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds op_timeout{120000};
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

/// What this rank saw of one optimizer step: the figures accumulated since the previous
/// report_step (or since the client was created).
struct StepStats {
  int64_t step = -1;              ///< the label given to report_step
  double exposed_wait_s = 0.0;    ///< seconds spent blocked in wait_update
  int64_t bytes_pushed = 0;       ///< gradient bytes pushed (grad dtype)
  int parameters = 0;             ///< updates taken by wait_update
  std::string slowest_parameter;  ///< of those, the one whose update arrived last ("" if none)
};

class Client {
 public:
  /// Connects to every server. Throws ConnectionLost naming the unreachable server.
  explicit Client(ClientConfig config);
  ~Client();

  /// Registers parameters with their owner servers and waits until every rank of the job has
  /// registered them (the server answers then). Throws InvalidArgument (bad server index),
  /// ServerError (refused: the message names the parameter and the reason), Timeout
  /// (other ranks did not register; the message names them), ConnectionLost.
  void register_parameters(const std::vector<ParameterRegistration>& params);

  /// Pushes `count` elements (grad dtype) at element `offset` of the parameter for `step`.
  /// Several pushes of the same elements in one step accumulate on the server. Returns once the
  /// data sits in shared memory.
  void push(const std::string& name, int64_t step, int64_t offset, const void* data, int64_t count);
  /// Declares this rank's contribution to (name, step) complete.
  void commit(const std::string& name, int64_t step);
  /// Waits until every server has taken all pushed data out of shared memory.
  void flush();
  /// Waits for the update of (name, step) and copies the packed want ranges (update dtype) to
  /// dst. Returns false when the server skipped the step (non-finite policy skip; dst zeroed).
  bool wait_update(const std::string& name, int64_t step, void* dst);
  bool update_ready(const std::string& name, int64_t step);
  /// Calls `cb(name, step)` on a client thread as each update completes (once per parameter and
  /// step; it may run just before or just after a wait_update of the same step returns). The
  /// callback must not block on the client.
  void set_update_callback(UpdateCallback cb);

  /// The server-held fp32 momentum of a parameter (all elements) and its last applied step.
  std::vector<float> fetch_momentum(const std::string& name, int64_t* last_step = nullptr);
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

  /// Drops every connection, reconnects (with the connect timeout) and registers every
  /// parameter again — for a server that restarted from its snapshot.
  void reconnect();

  const ClientConfig& config() const { return config_; }
  /// The registration of a parameter. Throws InvalidArgument for an unknown name.
  const ParameterRegistration& registration(const std::string& name) const;

 private:
  Connection& owner(const std::string& name);
  void connect_all();
  /// Installed on every connection: records when each update completed, then calls callback_.
  void on_update_complete(const std::string& name, int64_t step);
  ClientConfig config_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::map<std::string, ParameterRegistration> params_;

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
