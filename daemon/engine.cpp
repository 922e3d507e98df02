// The Engine's wiring: construction (snapshot restore, the plan), the relay toward owners, the
// sessions' index, and shutdown. Each stage's handlers are in their own file (engine.hpp).
#include "daemon/engine.hpp"

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
#include "daemon/log.hpp"
#include "daemon/plan_calibration.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

namespace asio = boost::asio;

namespace {

// The GPU data plane when the backend is CUDA and --host-staging is off; null otherwise.
std::unique_ptr<DevicePlane> make_device_plane(const ServerConfig& config, const Backend* backend) {
  if (backend == nullptr || backend->name() != "cuda" || config.host_staging) return nullptr;
  DevicePlaneConfig dc;
  dc.device = config.cuda_device;
  dc.priority = parse_stream_priority(config.stream_priority);
  dc.capture_graphs = config.cuda_graphs;
  auto plane = std::make_unique<DevicePlane>(dc);
  log()->info("GPU data plane on device {} (streams {}, CUDA graphs {})", dc.device,
              config.stream_priority, dc.capture_graphs ? "on" : "off");
  return plane;
}

}  // namespace

Engine::Engine(asio::io_context& io, ServerConfig config, std::unique_ptr<Backend> backend)
    : io_(io),
      config_(std::move(config)),
      device_(make_device_plane(config_, backend.get())),
      metrics_(MUON_OFFLOAD_VERSION, backend ? std::string(backend->name()) : "none",
               config_.plan_path.empty() ? -1 : config_.server_id),
      scheduler_(
          std::move(backend),
          [this](std::vector<NsJob> jobs) {
            asio::post(io_,
                       [this, jobs = std::move(jobs)]() mutable { finish_jobs(std::move(jobs)); });
          },
          device_ ? device_->step_runner() : nullptr) {
  if (config_.snapshot_every > 0 && config_.snapshot_path.empty()) {
    throw InvalidArgument("--snapshot-every " + std::to_string(config_.snapshot_every) +
                          " needs --snapshot PATH (the file the periodic snapshots replace)");
  }
  writer_ = std::make_unique<SnapshotWriter>(
      [this, alive = std::weak_ptr<bool>(alive_)](std::function<void()> fn) {
        asio::post(io_, [alive, fn = std::move(fn)] {
          if (alive.lock()) fn();
        });
      });
  if (!config_.restore_path.empty()) {
    std::vector<NsChoiceTable::Entry> choices;
    auto entries = read_snapshot(config_.restore_path, &choices);
    // The algorithms auto ran before the restart run again (and the in-process reference reads
    // them from the machine's table): the same bits on resume.
    NsChoiceTable::process().adopt(choices);
    if (!entries.empty() && common_step(entries) == -2) {
      log()->warn("snapshot {} mixes steps ({}): it was written mid-step; a resume_from_server "
                  "registration that adopts these steps is refused by the client unless asked "
                  "to adopt each parameter's own step",
                  config_.restore_path, describe_steps(entries));
    }
    for (auto& e : entries) {
      log()->info("restored momentum of '{}' (last step {}) from {}", e.name, e.last_step,
                  config_.restore_path);
      std::string name = e.name;
      restored_.emplace(std::move(name), std::move(e));
    }
  }
  if (!config_.plan_path.empty()) {
    if (config_.server_id < 0) {
      throw InvalidArgument("--plan needs --server-id (this server's id in the plan)");
    }
    routes_.emplace(PoolRoutes::from_file(config_.plan_path, config_.server_id));
    if (routes_->relayed() > 0 &&
        static_cast<int>(config_.pool_servers.size()) != routes_->servers()) {
      throw InvalidArgument(
          "plan '" + config_.plan_path + "' has server " + std::to_string(config_.server_id) +
          " relay " + std::to_string(routes_->relayed()) +
          " parameter(s) to their owners: --pool-servers must list the " +
          std::to_string(routes_->servers()) + " servers of the plan in id order, got " +
          std::to_string(config_.pool_servers.size()));
    }
    if (!config_.pool_servers.empty() && !config_.socket_path.empty()) {
      // The pool names this server too: a swapped --server-id would route every rank wrongly.
      const auto& own = config_.pool_servers[static_cast<size_t>(config_.server_id)];
      std::error_code ec;
      if (!transport::parse_endpoint(own).is_tcp() &&
          std::filesystem::weakly_canonical(own, ec) !=
              std::filesystem::weakly_canonical(config_.socket_path, ec)) {
        throw InvalidArgument(
            "--pool-servers lists '" + own + "' as server " + std::to_string(config_.server_id) +
            " (--server-id), but this server listens on '" + config_.socket_path + "'");
      }
    }
    if (config_.replicate && routes_->buddy_of(config_.server_id) >= 0 &&
        static_cast<int>(config_.pool_servers.size()) != routes_->servers()) {
      log()->warn("plan '{}' names server {} as the buddy of server {}, but --pool-servers does "
                  "not list the plan's {} servers: no replication (a crash of this server loses "
                  "the steps since its last snapshot)",
                  config_.plan_path, routes_->buddy_of(config_.server_id), config_.server_id,
                  routes_->servers());
      config_.replicate = false;
    }
    log()->info("plan {}: server {} of {}, {} compute ranks, relays {} parameter(s)",
                config_.plan_path, config_.server_id, routes_->servers(), routes_->world_size(),
                routes_->relayed());
    // auto's choices for the shapes this server will orthogonalize, measured now on the
    // scheduler's worker (not on the io thread, and before any job: the first step does not
    // wait for them); a registration then finds them in the table.
    const auto planned = planned_matrices_from_file(config_.plan_path, config_.server_id);
    for (const auto& m : planned) scheduler_.prepare(m.name, m.shape, m.options);
    if (!planned.empty()) {
      log()->info("plan {}: preparing Newton-Schulz for the {} parameter(s) this server owns",
                  config_.plan_path, planned.size());
    }
  }
  schedule_forgetting();
}

Engine::~Engine() {
  replicator_.reset();  // before the parameters whose buffers its thread may be reading
  relay_.reset();  // its last outcomes are posted to an io_context nobody runs any more
  scheduler_.stop();
}

transport::DataPlane Engine::peer_plane() const {
  return device_ ? transport::DataPlane::nccl : transport::DataPlane::shm;
}

PoolPeers Engine::pool_peers() const {
  PoolPeers peers;
  peers.endpoints = config_.pool_servers;
  peers.server_id = config_.server_id;
  peers.world_size = routes_->world_size();
  peers.remote_plane = peer_plane();
  peers.auth_token = config_.auth_token;
  peers.device = config_.cuda_device;
  return peers;
}

Relay& Engine::relay() {
  if (!relay_) {
    RelayConfig rc;
    rc.peers = pool_peers();
    rc.op_timeout = std::max(config_.step_timeout * 4, std::chrono::milliseconds(120000));
    // Owners with a buddy fail over to it (replication on: the buddy holds their state).
    if (config_.replicate) {
      for (int i = 0; i < routes_->servers(); ++i) rc.buddies.push_back(routes_->buddy_of(i));
    }
    relay_ = std::make_unique<Relay>(std::move(rc), io_);
  }
  return *relay_;
}

Replicator& Engine::replicator() {
  if (!replicator_) {
    ReplicatorConfig rc;
    rc.peers = pool_peers();
    rc.op_timeout = std::max(config_.step_timeout, std::chrono::milliseconds(10000));
    replicator_ = std::make_unique<Replicator>(std::move(rc), io_);
  }
  return *replicator_;
}

std::unique_ptr<ParamStorage> Engine::make_storage(int64_t numel, bool momentum) {
  if (device_) return device_->make_storage(numel, momentum, completions_);
  return make_host_param_storage(config_.defer_host_copies ? &completions_ : nullptr);
}

void Engine::poll_completions() {
  if (completion_polling_) return;
  completion_polling_ = true;
  completion_timer_.expires_after(CompletionQueue::kPoll);
  completion_timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](
                                   boost::system::error_code ec) {
    if (ec || !alive.lock()) return;
    completion_polling_ = false;
    bool more = false;
    try {
      more = completions_.poll();
    } catch (const std::exception& e) {  // a continuation's own failure: logged, the rest go on
      log()->error("a step's copy from the GPU: {}", e.what());
      metrics_.error(ErrorCode::internal);
      more = completions_.pending() > 0;
    }
    if (more) poll_completions();
  });
}

std::string Engine::rank_name(int rank) const {
  return rank_text(rank, world_size_);
}

void Engine::add_session(const SessionPtr& s) {
  sessions_[s->id()] = s;
}

Engine::SessionPtr Engine::session_of(int rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return nullptr;
  auto s = it->second.lock();
  return s && !s->closed() ? s : nullptr;
}

bool Engine::any_computing() const {
  // Relayed steps hold no momentum here: snapshots and shutdown need not wait for them.
  return std::any_of(params_.begin(), params_.end(), [](const auto& kv) {
    // A replicating step's update has not gone out yet: a shutdown waits for it too.
    return (kv.second.phase() == Phase::computing && kv.second.role->keeps_momentum_here()) ||
           kv.second.phase() == Phase::replicating;
  });
}

void Engine::shutdown(const std::string& why, std::function<void()> done) {
  stopping_ = true;
  shutdown_done_ = std::move(done);
  shutdown_why_ = "server shutting down (" + why + ")";
  // Steps still being gathered are aborted: nothing of them reached the momentum.
  for (auto& [name, p] : params_) {
    if (const auto dropped = p.steps.drop()) {
      const int64_t step = dropped->step;
      report_dropped(p,
                     {ErrorCode::shutdown,
                      shutdown_why_ + ": step " + std::to_string(step) + " of '" + name +
                          "' aborted, momentum untouched",
                      name, step, -1},
                     -1);
    }
    if (p.timer) p.timer->cancel();
  }
  maybe_finish_shutdown();
}

void Engine::maybe_finish_shutdown() {
  if (!stopping_ || !shutdown_done_ || any_computing()) return;
  // The updates of finished steps still coming back from the GPU go out before the sessions
  // close (at shutdown the io thread may wait for its own device copies). One of them may start
  // a replication (its end calls this again), or finish the shutdown itself (after_steps).
  completions_.drain();
  if (!shutdown_done_ || any_computing()) return;
  if (!config_.snapshot_path.empty()) {
    try {
      write_final_snapshot();
    } catch (const Error& e) {
      log()->error("final snapshot failed: {}", e.what());
    }
  }
  std::vector<SessionPtr> open;  // close() re-enters on_closed, which edits sessions_
  for (auto& [id, w] : sessions_) {
    if (auto s = w.lock()) open.push_back(s);
  }
  for (auto& s : open) {
    s->send_error({ErrorCode::shutdown, shutdown_why_, "", -1, -1});
    s->close("server shutdown");
  }
  // Nothing may keep the io_context running now: a pending step or registration timer would
  // hold the process up to its step timeout after every session closed.
  for (auto& [name, p] : params_) {
    if (p.timer) p.timer->cancel();
  }
  for (auto& [id, h] : held_fetches_) {
    if (h.timer) h.timer->cancel();
  }
  forget_timer_.cancel();
  // The pool's links go too, saying goodbye (nothing is owed once nothing computes: the peers
  // must not take this server for lost); each closes once its goodbye is written.
  if (replicator_) replicator_->leave();
  if (relay_) relay_->leave();
  replicator_.reset();
  relay_.reset();
  scheduler_.stop();
  auto done = std::move(shutdown_done_);
  shutdown_done_ = nullptr;
  done();
}

}  // namespace muon::daemon
