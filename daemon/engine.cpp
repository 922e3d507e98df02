#include "daemon/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.hpp"
#include "transport/auth_token.hpp"
#include "transport/bf16.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::ErrorMsg;
using transport::Frame;
using transport::MessageType;

namespace {

std::shared_ptr<spdlog::logger> log() {
  static auto logger = [] {
    auto l = spdlog::get("server");
    return l ? l : spdlog::default_logger();
  }();
  return logger;
}

// "[0, 1]"; with the job's world size, relays' ranks by name: "[0, 1, relay server 1]".
std::string ranks_text(const std::vector<int>& ranks, int world_size) {
  return "[" + rank_ids_text(ranks, world_size) + "]";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int64_t> dims_of(const MatrixShape& s) {
  if (s.batch == 1) return {s.rows, s.cols};
  return {s.batch, s.rows, s.cols};
}

// A rank contributes to a parameter when it pushes at least one element.
bool contributes(const ParameterLayout& l, int rank) {
  return rank >= 0 && rank < static_cast<int>(l.ranks.size()) && !l.ranks[rank].push.empty();
}

// The union of every rank's `field` ranges, merged, ascending.
std::vector<Range> covered(const ParameterLayout& l, std::vector<Range> RankRanges::*field) {
  std::vector<Range> all;
  for (const auto& r : l.ranks) all.insert(all.end(), (r.*field).begin(), (r.*field).end());
  std::sort(all.begin(), all.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  for (const auto& r : all) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<Range> sorted(std::vector<Range> r) {
  std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return r;
}

bool same_ranges(const std::vector<Range>& a, const std::vector<Range>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].begin != b[i].begin || a[i].end != b[i].end) return false;
  }
  return true;
}

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
      metrics_(MUON_OFFLOAD_VERSION, backend ? std::string(backend->name()) : "none"),
      scheduler_(
          std::move(backend),
          [this](std::vector<NsJob> jobs) {
            asio::post(io_,
                       [this, jobs = std::move(jobs)]() mutable { finish_jobs(std::move(jobs)); });
          },
          device_.get()) {
  if (!config_.restore_path.empty()) {
    for (auto& e : read_snapshot(config_.restore_path)) {
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
    log()->info("plan {}: server {} of {}, {} compute ranks, relays {} parameter(s)",
                config_.plan_path, config_.server_id, routes_->servers(), routes_->world_size(),
                routes_->relayed());
  }
}

Engine::~Engine() {
  relay_.reset();  // its last outcomes are posted to an io_context nobody runs any more
  scheduler_.stop();
}

Relay& Engine::relay() {
  if (!relay_) {
    RelayConfig rc;
    rc.pool = config_.pool_servers;
    rc.server_id = config_.server_id;
    rc.world_size = routes_->world_size();
    // An owner on another host is reached over NCCL from a GPU server, else over shared memory
    // (the same host; a CPU pool across hosts has no data plane between them).
    rc.remote_plane = device_ ? transport::DataPlane::nccl : transport::DataPlane::shm;
    rc.auth_token = config_.auth_token;
    rc.op_timeout = std::max(config_.step_timeout * 4, std::chrono::milliseconds(120000));
    relay_ = std::make_unique<Relay>(
        std::move(rc), [this, alive = std::weak_ptr<bool>(alive_)](std::function<void()> fn) {
          asio::post(io_, [alive, fn = std::move(fn)] {
            if (alive.lock()) fn();
          });
        });
  }
  return *relay_;
}

std::string Engine::rank_name(int rank) const {
  return rank_text(rank, world_size_);
}

size_t Engine::pre_hello_tcp_sessions() const {
  size_t n = 0;
  for (const auto& [id, w] : sessions_) {
    if (auto s = w.lock(); s && s->tcp && s->rank < 0 && !s->closed()) ++n;
  }
  return n;
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
    return kv.second.computing && kv.second.relay_owner < 0;
  });
}

void Engine::broadcast(const Param& p, const ErrorMsg& error, int except_rank) {
  if (!p.layout) return;
  for (int r : p.layout->registrants) {
    if (r == except_rank) continue;
    if (auto s = session_of(r)) s->send_error(error);
  }
}

// ---- frames ----------------------------------------------------------------------------------

void Engine::on_frame(const SessionPtr& s, Frame f) {
  const auto type = static_cast<MessageType>(f.type);
  try {
    // Before hello only health answers, and status on the Unix socket (uid-checked); a TCP peer
    // must say hello with the token first.
    if (type != MessageType::hello && type != MessageType::health && s->rank < 0 &&
        (type != MessageType::status || s->tcp)) {
      throw transport::ProtocolError(transport::message_type_name(f.type) +
                                     " before hello: say hello first");
    }
    switch (type) {
      case MessageType::hello:
        on_hello(s, f);
        break;
      case MessageType::health: {
        transport::HealthOk h;
        h.ready = !stopping_;
        h.sessions = static_cast<int>(sessions_.size());
        h.parameters = static_cast<int>(params_.size());
        s->send(MessageType::health_ok, transport::encode(h), f.request_id);
        break;
      }
      case MessageType::status:
        s->send(MessageType::status_ok, status_json(), f.request_id);
        break;
      case MessageType::register_param:
        on_register(s, f);
        break;
      case MessageType::push:
        on_push(s, f);
        break;
      case MessageType::commit:
        on_commit(s, f);
        break;
      case MessageType::update_ack:
        s->release_rx_slot(transport::decode<transport::SlotAck>(f.payload).slot);
        break;
      case MessageType::snapshot:
        on_snapshot(s, f);
        break;
      case MessageType::state_fetch:
        on_state_fetch(s, f);
        break;
      case MessageType::goodbye:
        s->close("goodbye");
        break;
      case MessageType::step_report:
        on_step_report(s, f);
        break;
      default:
        throw transport::ProtocolError("unexpected message " +
                                       transport::message_type_name(f.type) + " from a client");
    }
  } catch (const NonFiniteError& e) {
    reply_error(s, {"non_finite", e.message(), "", -1, -1}, f.request_id);
  } catch (const transport::ProtocolError& e) {
    log()->warn("session {} (rank {}): bad request: {}", s->id(), s->rank, e.message());
    reply_error(s, {"bad_request", e.message(), "", -1, -1}, f.request_id);
    // A TCP peer that has not said a valid hello gets one answer, then the door.
    if (s->tcp && s->rank < 0) s->close("bad request before hello");
  } catch (const InvalidArgument& e) {
    log()->warn("session {} (rank {}): bad request: {}", s->id(), s->rank, e.message());
    reply_error(s, {"bad_request", e.message(), "", -1, -1}, f.request_id);
  } catch (const Error& e) {
    log()->error("session {} (rank {}): {}", s->id(), s->rank, e.what());
    reply_error(s, {"server", e.message(), "", -1, -1}, f.request_id);
  }
}

void Engine::reply_error(const SessionPtr& s, const ErrorMsg& error, uint32_t request_id) {
  metrics_.error(error.code);
  s->send_error(error, request_id);
}

void Engine::on_step_report(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::StepReport>(f.payload);
  metrics_.step_report(m);
  reports_[s->id()] = std::move(m);
}

bool Engine::open_data_plane(const SessionPtr& s, const transport::Hello& m, transport::HelloOk& ok,
                             uint32_t request_id) {
  if (m.data_plane != transport::DataPlane::shm) {
    const char* plane = transport::data_plane_name(m.data_plane);
    if (!device_) {
      reply_error(s,
                  {"unsupported",
                   std::string("data plane ") + plane +
                       " needs a server on the CUDA backend with its GPU data plane (this one "
                       "runs the " +
                       std::string(scheduler_.backend().name()) + " backend" +
                       (config_.host_staging ? " with --host-staging" : "") +
                       "); connect with data plane shm",
                   "", -1, m.rank},
                  request_id);
      return false;
    }
    const auto& l = config_.layout;
    DeviceRingsPtr rings;
    try {
      rings = m.data_plane == transport::DataPlane::nccl
                  ? device_->make_nccl_session(l.tx_slots, l.rx_slots, l.slot_bytes)
                  : device_->make_session_rings(l.tx_slots, l.rx_slots, l.slot_bytes);
    } catch (const BackendUnavailable& e) {
      reply_error(s, {"unsupported", e.message(), "", -1, m.rank}, request_id);
      return false;
    }
    // Chunks that waited for a credit: their element size says their dtype (2: bf16).
    s->use_device_rings(
        rings, l.rx_slots,
        [dev = device_.get(), rings](uint32_t slot, const transport::Update& u,
                                     const std::vector<std::byte>& d) {
          const bool bf16 = d.size() == 2 * static_cast<size_t>(u.count);
          dev->send_host(*rings, slot, d.data(), d.size(), bf16 ? DType::bf16 : DType::f32);
        },
        m.data_plane == transport::DataPlane::nccl);
    ok.data_plane = m.data_plane;
    if (m.data_plane == transport::DataPlane::nccl) {
      s->nccl = true;
      s->hold_data_plane();
      std::tie(ok.nccl_tx_id, ok.nccl_rx_id) = DevicePlane::nccl_ids(*rings);
      // The client joins both communicators once it has the ids (the server drops one that
      // does not within the step timeout); results wait as host bytes until then. The callback
      // runs on the joining thread, which may outlive this Engine: `alive_` says.
      std::weak_ptr<Session> weak = s;
      std::weak_ptr<bool> alive = alive_;
      device_->join_nccl(
          rings, config_.step_timeout, [&io = io_, weak, alive](const std::string& error) {
            if (alive.expired()) return;
            asio::post(io, [weak, alive, error] {
              auto ss = weak.lock();
              if (!ss || alive.expired()) return;
              if (error.empty()) {
                ss->set_data_plane_ready();
                return;
              }
              log()->warn("session {}: NCCL join failed: {}", ss->id(), error);
              ss->send_error({"nccl", "joining the session's NCCL communicators failed: " + error,
                              "", -1, ss->rank});
              ss->close("nccl join failed");
            });
          });
    } else {
      ok.tx_ring = DevicePlane::tx_descriptor(*rings);
      ok.rx_ring = DevicePlane::rx_descriptor(*rings);
    }
  } else {
    s->segment.emplace(transport::ShmSegment::create(config_.layout));
    ok.shm_name = s->segment->name();
  }
  return true;
}

void Engine::on_hello(const SessionPtr& s, const Frame& f) {
  if (s->rank >= 0) throw transport::ProtocolError("hello sent twice");
  auto m = transport::decode<transport::Hello>(f.payload);
  // The token first: an unauthenticated TCP peer learns nothing (world size, connected ranks).
  if (s->tcp &&
      (config_.auth_token.empty() || !transport::tokens_equal(m.token, config_.auth_token))) {
    log()->warn("session {}: refused a TCP hello of rank {}: wrong or missing token", s->id(),
                m.rank);
    reply_error(s,
                {"unauthorized", "hello over TCP needs the server's token (--auth-token-file)", "",
                 -1, m.rank},
                f.request_id);
    s->close("unauthorized");
    return;
  }
  if (routes_ && m.world_size != routes_->world_size()) {
    throw transport::ProtocolError("world size mismatch: the plan (" + routes_->source() +
                                   ") has " + std::to_string(routes_->world_size()) +
                                   " compute ranks, rank " + std::to_string(m.rank) + " says " +
                                   std::to_string(m.world_size));
  }
  if (world_size_ != 0 && m.world_size != world_size_) {
    throw transport::ProtocolError(
        "world size mismatch: this server serves a job of " + std::to_string(world_size_) +
        " ranks, rank " + std::to_string(m.rank) + " says " + std::to_string(m.world_size));
  }
  if (auto other = session_of(m.rank)) {
    throw transport::ProtocolError("rank " + std::to_string(m.rank) +
                                   " is already connected (session " + std::to_string(other->id()) +
                                   ")");
  }
  transport::HelloOk ok;
  if (!open_data_plane(s, m, ok, f.request_id)) return;  // refused: the error went out
  world_size_ = m.world_size;
  lost_ranks_.erase(m.rank);
  s->rank = m.rank;
  s->world_size = m.world_size;
  s->client_name = m.client;
  ranks_[m.rank] = s;
  ok.session = std::to_string(s->id());
  ok.server_version = "muon-offloadd " MUON_OFFLOAD_VERSION;
  ok.tx_slots = config_.layout.tx_slots;
  ok.rx_slots = config_.layout.rx_slots;
  ok.slot_bytes = config_.layout.slot_bytes;
  log()->info("session {}: {} of {} connected ({}, data plane {})", s->id(), rank_name(m.rank),
              m.world_size, m.client, transport::data_plane_name(ok.data_plane));
  s->send(MessageType::hello_ok, transport::encode(ok), f.request_id);
  for (auto& [name, p] : params_) {
    if (p.layout && !p.waiting.empty()) release_reregistrations(p);
  }
}

void Engine::on_register(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::RegisterParam>(f.payload);
  ParameterSpec spec;
  spec.name = m.name;
  spec.shape = matrix_shape_from_dims(m.shape, m.name);
  spec.grad_dtype = m.grad_dtype;
  spec.update_dtype = m.update_dtype;
  spec.options = m.options;
  auto it = params_.find(m.name);
  if (it != params_.end() && it->second.layout) {
    // Re-registration (a client that reconnected): must match what the job registered.
    Param& p = it->second;
    const auto& reg = p.layout->registrants;
    if (!std::binary_search(reg.begin(), reg.end(), s->rank)) {
      throw InvalidArgument("parameter '" + m.name + "' is registered here without " +
                            rank_name(s->rank) + " (registrants " + ranks_text(reg, world_size_) +
                            ")");
    }
    const auto& mine = p.layout->ranks.at(s->rank);
    if (!same_spec(spec, p.layout->spec) || !same_ranges(sorted(m.push), mine.push) ||
        !same_ranges(sorted(m.want), mine.want)) {
      throw InvalidArgument("parameter '" + m.name +
                            "' is already registered with another shape, dtype, options or "
                            "ranges for rank " +
                            std::to_string(s->rank));
    }
    // Answer once every rank of the job is connected again, so that nobody pushes a step that
    // needs a rank still restarting.
    p.waiting.emplace_back(s, f.request_id);
    release_reregistrations(p);
    return;
  }
  const bool fresh = it == params_.end();
  Param& p = params_[m.name];
  try {
    if (!p.pending) {
      // The plan's route says who registers it here (and whether this server relays it);
      // otherwise every rank of the job.
      const auto route = routes_ ? routes_->route(m.name) : std::nullopt;
      if (route) {
        p.pending.emplace(spec, route->registrants, world_size_);
        p.relay_owner = route->relayed ? route->owner : -1;
      } else {
        p.pending.emplace(spec, world_size_);
      }
    }
    const bool complete = p.pending->add(s->rank, spec, m.push, m.want);
    p.waiting.emplace_back(s, f.request_id);
    if (complete) {
      complete_registration(m.name, p);
    } else if (!p.timer) {
      arm_timer(m.name, p);
    }
  } catch (...) {
    if (fresh && p.waiting.empty()) params_.erase(m.name);
    throw;
  }
}

void Engine::complete_registration(const std::string& name, Param& p) {
  auto waiting = std::move(p.waiting);
  p.waiting.clear();
  if (p.timer) p.timer->cancel();
  p.timer.reset();
  try {
    p.layout.emplace(p.pending->finish(/*partial=*/p.relay_owner >= 0));
  } catch (const InvalidArgument& e) {
    metrics_.error("bad_request");
    for (auto& [w, req] : waiting) {
      if (auto ws = w.lock()) ws->send_error({"bad_request", e.message(), name, -1, -1}, req);
    }
    params_.erase(name);
    return;
  }
  p.pending.reset();
  const auto& shape = p.layout->spec.shape;
  if (p.relay_owner >= 0) {  // relayed: the owner keeps the momentum and answers for the job
    if (device_) p.device = device_->make_param(shape.numel(), false);
    transport::RegisterParam reg;
    reg.name = name;
    reg.shape = dims_of(shape);
    reg.grad_dtype = p.layout->spec.grad_dtype;
    reg.update_dtype = p.layout->spec.update_dtype;
    reg.options = p.layout->spec.options;
    // The domain's partial sum covers what its ranks push; it wants what they want.
    reg.push = covered(*p.layout, &RankRanges::push);
    reg.want = covered(*p.layout, &RankRanges::want);
    p.waiting = std::move(waiting);
    log()->info(
        "parameter '{}' {} registered by ranks {} of this domain; registering it with its "
        "owner, server {}",
        name, shape.str(), ranks_text(p.layout->registrants, world_size_), p.relay_owner);
    relay().register_param(
        p.relay_owner, std::move(reg),
        [this, name](std::optional<ErrorMsg> error, transport::RegisterOk ok) {
          auto it = params_.find(name);
          if (it == params_.end() || !it->second.layout) return;
          Param& q = it->second;
          if (error) {
            log()->warn("parameter '{}': the owner refused the relay's registration: {}", name,
                        error->message);
            metrics_.error(error->code);
            for (auto& [w, req] : q.waiting) {
              if (auto ws = w.lock()) ws->send_error(*error, req);
            }
            params_.erase(it);
            return;
          }
          q.awaiting_owner = false;
          q.last_step = ok.last_step;
          answer_registration(q);
        },
        // What the owner says outside the answers to forwarded steps (unasked updates for a
        // domain that pushes nothing, errors of steps not forwarded, a restart).
        [this](RelayStep st) { finish_relayed(std::move(st)); });
    p.awaiting_owner = true;
    return;
  }
  p.momentum.assign(static_cast<size_t>(shape.numel()), 0.0f);
  if (auto r = restored_.find(name); r != restored_.end()) {
    const auto rs = matrix_shape_from_dims(r->second.shape, name);
    if (rs.batch == shape.batch && rs.rows == shape.rows && rs.cols == shape.cols) {
      p.momentum = r->second.momentum;
      p.last_step = r->second.last_step;
    } else {
      log()->warn("snapshot holds '{}' as {} but it was registered as {}: starting from zero", name,
                  rs.str(), shape.str());
    }
  }
  if (device_) {
    const bool keeps = p.layout->spec.options.momentum.convention != MomentumConvention::none;
    p.device = device_->make_param(shape.numel(), keeps);
    if (keeps && p.last_step >= 0) {
      device_->write_momentum(*p.device, 0, p.momentum.data(), shape.numel());
    }
  }
  log()->info("parameter '{}' {} registered by ranks {}, {} contributor(s) per element", name,
              shape.str(), ranks_text(p.layout->registrants, world_size_), p.layout->contributors);
  p.waiting = std::move(waiting);
  answer_registration(p);
}

void Engine::answer_registration(Param& p) {
  const transport::RegisterOk ok{p.layout->spec.name, p.layout->contributors, p.last_step};
  auto waiting = std::move(p.waiting);
  p.waiting.clear();
  for (auto& [w, req] : waiting) {
    if (auto ws = w.lock()) ws->send(MessageType::register_ok, transport::encode(ok), req);
  }
}

void Engine::release_reregistrations(Param& p) {
  if (p.awaiting_owner) return;  // the owner answers first (complete_registration)
  for (int r : p.layout->registrants) {
    if (!session_of(r)) return;
  }
  answer_registration(p);
}

Engine::Param& Engine::registered_param(const std::string& name, const SessionPtr& s) {
  auto it = params_.find(name);
  if (it == params_.end() || !it->second.layout) {
    throw InvalidArgument("unknown parameter '" + name + "' (not registered by every rank)");
  }
  const auto& reg = it->second.layout->registrants;
  if (!std::binary_search(reg.begin(), reg.end(), s->rank)) {
    throw InvalidArgument(rank_name(s->rank) + " is not part of parameter '" + name +
                          "' on this server (registrants " + ranks_text(reg, world_size_) + ")");
  }
  return it->second;
}

void Engine::load_momentum(const transport::Push& m, Param& p, std::span<const float> values) {
  if (p.computing || p.reducer) {
    throw InvalidArgument("cannot load the momentum of '" + m.name + "' while step is in progress");
  }
  if (p.relay_owner >= 0) {  // the owner keeps it: forwarded, in order with the steps
    p.last_step = m.step;
    relay().forward_momentum(p.relay_owner, m.name, m.step, m.offset,
                             {values.begin(), values.end()}, [this, name = m.name](ErrorMsg error) {
                               auto it = params_.find(name);
                               if (it != params_.end()) broadcast(it->second, error);
                               metrics_.error(error.code);
                             });
    return;
  }
  if (p.device && p.layout->spec.options.momentum.convention != MomentumConvention::none) {
    device_->write_momentum(*p.device, m.offset, values.data(), m.count);
  }
  std::memcpy(p.momentum.data() + m.offset, values.data(), values.size_bytes());
  p.last_step = m.step;
}

void Engine::check_gradient_step(const transport::Push& m, const Param& p) const {
  if (p.computing) {
    throw InvalidArgument("parameter '" + m.name + "': step " + std::to_string(m.step) +
                          " pushed while step " + std::to_string(p.last_step + 1) +
                          " is still being computed");
  }
  if (p.last_step >= 0 && m.step <= p.last_step) {
    throw InvalidArgument("parameter '" + m.name + "': step " + std::to_string(m.step) +
                          " was already applied (last applied step " + std::to_string(p.last_step) +
                          ")");
  }
  if (p.last_step >= 0 && m.step > p.last_step + 1) {
    throw InvalidArgument("parameter '" + m.name + "': step gap: got step " +
                          std::to_string(m.step) + ", expected " + std::to_string(p.last_step + 1));
  }
  if (p.reducer && p.reducer->step() != m.step) {
    throw InvalidArgument("parameter '" + m.name + "': step " + std::to_string(m.step) +
                          " pushed while step " + std::to_string(p.reducer->step()) +
                          " is being gathered");
  }
}

void Engine::start_gathering(const SessionPtr& s, const transport::Push& m, Param& p) {
  if (p.reducer) return;
  // A step that needs a lost rank can never complete: say so now, not at the timeout.
  for (const auto& [lost, what] : lost_ranks_) {
    if (contributes(*p.layout, lost)) {
      reply_error(s, {"peer_lost",
                      what + "; step " + std::to_string(m.step) + " of '" + m.name +
                          "' cannot complete until it reconnects",
                      m.name, m.step, lost});
      return;
    }
  }
  if (p.reducer_buffers) {
    p.reducer_buffers->restart(m.step);
  } else {
    p.reducer_buffers.emplace(
        *p.layout, m.step,
        p.device ? device_->make_contribution_store() : make_host_contribution_store());
  }
  p.reducer = &*p.reducer_buffers;
  p.step_started = std::chrono::steady_clock::now();
  arm_timer(m.name, p);
}

void Engine::on_push(const SessionPtr& s, const Frame& f) {
  // On the nccl plane the client queued the chunk's ncclSend together with the frame: a push
  // refused before its ncclRecv was posted would leave that send to match the next receive and
  // shift every later chunk. Such a session ends (after the reply that says why).
  bool received = false;
  struct CloseIfUnmatched {
    asio::io_context& io;
    const SessionPtr& s;
    const bool& received;
    ~CloseIfUnmatched() {
      if (!s->nccl || received || s->closed()) return;
      asio::post(io, [s = s] {
        s->close("a push was refused on the nccl data plane; its transfer cannot be matched");
      });
    }
  } close_if_unmatched{io_, s, received};
  auto m = transport::decode<transport::Push>(f.payload);
  if (m.slot >= config_.layout.tx_slots) {
    throw transport::ProtocolError("push names tx slot " + std::to_string(m.slot) + " of " +
                                   std::to_string(config_.layout.tx_slots));
  }
  // The slot is free again however this push ends: credits are never lost.
  // A device slot is freed on the GPU too: its free event is recorded after the reads enqueued.
  struct AckOnExit {
    const SessionPtr& s;
    uint32_t slot;
    DevicePlane* device;
    ~AckOnExit() {
      if (s->device_rings) {
        try {
          device->end_receive(*s->device_rings, slot);
        } catch (const std::exception& e) {
          log()->error("session {}: freeing receive slot {}: {}", s->id(), slot, e.what());
        }
      }
      s->send(MessageType::push_ack, transport::encode(transport::SlotAck{slot}));
    }
  } ack{s, m.slot, device_.get()};
  try {
    Param& p = registered_param(m.name, s);
    const auto& spec = p.layout->spec;
    // Momentum (state loading) always travels as fp32, gradients in their registered dtype.
    const DType dt = m.kind == transport::ChunkKind::momentum ? DType::f32 : spec.grad_dtype;
    if (static_cast<uint64_t>(m.count) * transport::dtype_bytes(dt) > config_.layout.slot_bytes) {
      throw InvalidArgument("push of " + std::to_string(m.count) + " elements of '" + m.name +
                            "' is larger than a slot");
    }
    if (m.offset + m.count > spec.shape.numel()) {
      throw InvalidArgument("push of '" + m.name + "' elements [" + std::to_string(m.offset) +
                            ", " + std::to_string(m.offset + m.count) + ") is outside its " +
                            std::to_string(spec.shape.numel()) + " elements");
    }
    const size_t bytes = static_cast<size_t>(m.count) * transport::dtype_bytes(dt);
    if (s->device_rings) {  // GPU data plane: the slot is device memory of this server
      const void* slot = device_->begin_receive(*s->device_rings, m.slot, m.count, dt);
      received = true;
      if (m.kind == transport::ChunkKind::gradient) {
        check_gradient_step(m, p);
        start_gathering(s, m, p);
        if (!p.reducer) return;  // refused (a lost rank): the error went out
        p.reducer->begin_attempt(s->rank, m.attempt);
        p.reducer->add(s->rank, m.offset,
                       Contribution{slot, dt == DType::bf16 ? TileDType::bf16 : TileDType::f32,
                                    true, m.count});
        metrics_.chunk_received(m.kind, bytes);
        return;
      }
      if (widen_.size() < static_cast<size_t>(m.count)) widen_.resize(static_cast<size_t>(m.count));
      device_->read_tx_slot(*s->device_rings, m.slot, widen_.data(), bytes);  // momentum: fp32
      load_momentum(m, p, {widen_.data(), static_cast<size_t>(m.count)});
      metrics_.chunk_received(m.kind, bytes);
      return;
    }
    // fp32 is read straight from the shared-memory slot (no copy); bf16 is widened into a
    // reused scratch buffer.
    const std::byte* src = s->segment->tx_slot(m.slot);
    std::span<const float> values;
    if (dt == DType::f32) {
      values = {reinterpret_cast<const float*>(src), static_cast<size_t>(m.count)};
    } else {
      if (widen_.size() < static_cast<size_t>(m.count)) widen_.resize(static_cast<size_t>(m.count));
      for (int64_t i = 0; i < m.count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        widen_[i] = transport::bf16_to_f32(h);
      }
      values = {widen_.data(), static_cast<size_t>(m.count)};
    }
    if (m.kind == transport::ChunkKind::momentum) {
      load_momentum(m, p, values);
      metrics_.chunk_received(m.kind, bytes);
      return;
    }
    check_gradient_step(m, p);
    start_gathering(s, m, p);
    if (!p.reducer) return;  // refused (a lost rank): the error went out
    p.reducer->begin_attempt(s->rank, m.attempt);
    p.reducer->add(s->rank, m.offset, values);
    metrics_.chunk_received(m.kind, bytes);
  } catch (const InvalidArgument& e) {
    reply_error(s, {"bad_request", e.message(), m.name, m.step, s->rank}, f.request_id);
  }
}

void Engine::on_commit(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::Commit>(f.payload);
  try {
    Param& p = registered_param(m.name, s);
    if (!p.reducer || p.reducer->step() != m.step) {
      throw InvalidArgument("parameter '" + m.name + "': commit of step " + std::to_string(m.step) +
                            " that has no data from rank " + std::to_string(s->rank));
    }
    p.reducer->begin_attempt(s->rank, m.attempt);
    p.reducer->commit(s->rank);
    if (p.reducer->complete()) start_compute(m.name, p);
  } catch (const InvalidArgument& e) {
    reply_error(s, {"bad_request", e.message(), m.name, m.step, s->rank}, f.request_id);
  }
}

// ---- compute ---------------------------------------------------------------------------------

void Engine::start_compute(const std::string& name, Param& p) {
  if (p.timer) p.timer->cancel();
  p.timer.reset();
  NsJob job;
  job.name = name;
  job.step = p.reducer->step();
  job.shape = p.layout->spec.shape;
  job.options = p.layout->spec.options;
  if (p.relay_owner >= 0) {  // the domain's partial sum goes to the owner
    RelayStep step;
    step.name = name;
    step.step = job.step;
    step.owner = p.relay_owner;
    step.grad_dtype = p.layout->spec.grad_dtype;
    step.update_dtype = p.layout->spec.update_dtype;
    step.numel = job.shape.numel();
    step.grad = std::move(p.grad);
    step.grad.resize(static_cast<size_t>(step.numel));
    if (p.device) {
      device_->reduce(*p.reducer, *p.device);
      device_->read_grad(*p.device, step.grad.data());
    } else {
      p.reducer->reduce(step.grad.data());
    }
    step.push = covered(*p.layout, &RankRanges::push);
    step.want = covered(*p.layout, &RankRanges::want);
    p.reducer = nullptr;
    p.computing = true;
    relay().forward(std::move(step), [this](RelayStep done) { finish_relayed(std::move(done)); });
    return;
  }
  if (p.device) {  // GPU data plane: reduced on the receive stream, stepped on the device
    device_->reduce(*p.reducer, *p.device);
    job.device = p.device.get();
  } else {
    job.grad = std::move(p.grad);  // warm buffers, handed back in finish_jobs
    job.update = std::move(p.update);
    job.grad.resize(static_cast<size_t>(job.shape.numel()));
    p.reducer->reduce(job.grad.data());
  }
  p.reducer = nullptr;
  job.momentum =
      job.options.momentum.convention == MomentumConvention::none ? nullptr : p.momentum.data();
  const auto every = static_cast<uint64_t>(std::max<int64_t>(config_.health_sample_every, 0));
  job.sample_health = every > 0 && p.updates_started % every == 0;
  ++p.updates_started;
  p.computing = true;
  scheduler_.submit(std::move(job));
}

void Engine::finish_relayed(RelayStep step) {
  auto it = params_.find(step.name);
  if (it == params_.end() || !it->second.layout) return;
  Param& p = it->second;
  if (step.resync) {  // registered again with an owner that restarted
    if (p.last_step != step.step) {
      log()->warn("parameter '{}': its owner restarted at last applied step {} (this relay had {})",
                  step.name, step.step, p.last_step);
    }
    p.last_step = step.step;
    return;
  }
  if (!step.unasked) {  // the answer to this relay's forward
    p.computing = false;
    p.grad = std::move(step.grad);
  }
  if (step.error) {
    // The owner consumed a refused step (non-finite, backend) as its own; a dropped one (a lost
    // peer, a timeout) may be retried.
    if (step.error->code == "non_finite" || step.error->code == "backend") p.last_step = step.step;
    log()->warn("parameter '{}' step {}: {}", step.name, step.step, step.error->message);
    metrics_.error(step.error->code);
    metrics_.step_done("refused");
    broadcast(p, *step.error);
    after_steps();
    return;
  }
  p.last_step = step.step;
  NsJob job;
  job.name = step.name;
  job.step = step.step;
  job.shape = p.layout->spec.shape;
  job.applied = step.applied;
  job.update = std::move(step.update);
  // On the GPU data plane the owner's update goes into the device buffer first, as if computed.
  if (!step.want.empty()) return_update(p, job, /*upload=*/p.device != nullptr);
  metrics_.step_done(job.applied ? "applied" : "skipped");
  if (!step.unasked) metrics_.step_latency(seconds_since(p.step_started));
  p.update = std::move(job.update);
  after_steps();
}

void Engine::return_update(Param& p, NsJob& job, bool upload) {
  try {
    if (upload) device_->write_update(*p.device, job.update.data());
    send_update(job.name, p, job);
  } catch (const std::exception& e) {  // a CUDA copy failed: tell the ranks, keep serving
    log()->error("parameter '{}' step {}: returning the update failed: {}", job.name, job.step,
                 e.what());
    metrics_.error("backend");
    broadcast(p, {"backend",
                  "returning the update of '" + job.name + "' step " + std::to_string(job.step) +
                      " failed: " + e.what(),
                  job.name, job.step, -1});
  }
}

void Engine::finish_jobs(std::vector<NsJob> jobs) {
  for (auto& job : jobs) {
    auto it = params_.find(job.name);
    if (it == params_.end()) continue;
    Param& p = it->second;
    p.computing = false;
    p.last_step = job.step;
    if (!job.error.empty()) {
      log()->warn("parameter '{}' step {}: {}", job.name, job.step, job.error);
      metrics_.error(job.error_code);
      metrics_.step_done("refused");
      broadcast(p, {job.error_code, job.error, job.name, job.step, -1});
      p.grad = std::move(job.grad);
      continue;
    }
    return_update(p, job, /*upload=*/false);
    metrics_.step_done(job.applied ? "applied" : "skipped");
    if (job.applied) metrics_.newton_schulz(job.shape, job.compute_seconds);
    metrics_.step_latency(seconds_since(p.step_started));
    if (job.health) observe_health(job.name, p, job);
    p.grad = std::move(job.grad);
    p.update = std::move(job.update);
  }
  after_steps();
}

void Engine::after_steps() {
  if (!any_computing()) {
    auto waiters = std::move(snapshot_waiters_);
    snapshot_waiters_.clear();
    for (auto& [w, req] : waiters) {
      auto ws = w.lock();
      if (!ws) continue;
      try {
        write_snapshot_now(req.first);
        ws->send(
            MessageType::snapshot_ok,
            transport::encode(transport::SnapshotOk{req.first, static_cast<int>(params_.size())}),
            req.second);
      } catch (const Error& e) {
        reply_error(ws, {"snapshot", e.message(), "", -1, -1}, req.second);
      }
    }
    maybe_finish_shutdown();
  }
}

void Engine::send_update(const std::string& name, Param& p, NsJob& job) {
  const DType dt = p.layout->spec.update_dtype;
  const size_t esize = transport::dtype_bytes(dt);
  const int64_t per_chunk = static_cast<int64_t>(config_.layout.slot_bytes / esize);
  // GPU data plane: cuda_ipc sessions get device-to-device copies into their result slots; a
  // chunk that must wait for a credit, and every chunk of a shm session, goes through host bytes
  // read back once per step (job.update).
  bool host_copy = !p.device;
  const auto host_update = [&]() -> const float* {
    if (!host_copy) {
      job.update.resize(static_cast<size_t>(job.shape.numel()));
      device_->read_update(*p.device, 0, job.shape.numel(), job.update.data());
      host_copy = true;
    }
    return job.update.data();
  };
  for (int r = 0; r < static_cast<int>(p.layout->ranks.size()); ++r) {
    const auto& want = p.layout->ranks[r].want;
    if (want.empty()) continue;
    auto s = session_of(r);
    if (!s) continue;
    for (size_t w = 0; w < want.size(); ++w) {
      for (int64_t off = want[w].begin; off < want[w].end; off += per_chunk) {
        const int64_t count = std::min(per_chunk, want[w].end - off);
        transport::Update u;
        u.name = name;
        u.step = job.step;
        u.offset = off;
        u.count = count;
        u.kind = transport::ChunkKind::gradient;
        u.last = w + 1 == want.size() && off + count == want[w].end;
        u.applied = job.applied;
        const size_t bytes = static_cast<size_t>(count) * esize;
        metrics_.chunk_returned(transport::ChunkKind::gradient, bytes);
        if (p.device && s->device_rings && s->send_chunk_direct(u, [&](uint32_t slot) {
              device_->send_update(*s->device_rings, slot, *p.device, off, count, dt);
            })) {
          continue;
        }
        std::vector<std::byte> data(bytes);
        const float* src = host_update() + off;
        if (dt == DType::f32) {
          std::memcpy(data.data(), src, data.size());
        } else {
          for (int64_t i = 0; i < count; ++i) {
            const uint16_t h = transport::f32_to_bf16(src[i]);
            std::memcpy(data.data() + 2 * i, &h, 2);
          }
        }
        s->send_chunk(std::move(u), std::move(data));
      }
    }
  }
  if (p.device) device_->updates_enqueued(*p.device);
}

// ---- failures --------------------------------------------------------------------------------

void Engine::arm_timer(const std::string& name, Param& p) {
  p.timer = std::make_unique<asio::steady_timer>(io_, config_.step_timeout);
  const int64_t step = p.reducer ? p.reducer->step() : -1;
  p.timer->async_wait([this, name, step](boost::system::error_code ec) {
    if (ec) return;  // cancelled
    auto it = params_.find(name);
    if (it == params_.end()) return;
    Param& q = it->second;
    const auto ms = std::to_string(config_.step_timeout.count());
    if (q.pending) {
      const auto missing = q.pending->missing_ranks();
      const std::string msg = "registration of '" + name + "' incomplete after " + ms +
                              " ms: ranks " + ranks_text(missing, world_size_) +
                              " have not registered it";
      log()->warn("{}", msg);
      metrics_.error("timeout");
      for (auto& [w, req] : q.waiting) {
        if (auto ws = w.lock()) ws->send_error({"timeout", msg, name, -1, -1}, req);
      }
      return;
    }
    if (q.reducer && q.reducer->step() == step && !q.reducer->complete()) {
      const auto missing = q.reducer->missing_ranks();
      drop_step(name, q,
                {"timeout",
                 "parameter '" + name + "' step " + std::to_string(step) + ": ranks " +
                     ranks_text(missing, world_size_) + " did not commit within " + ms +
                     " ms; partial step dropped, momentum untouched",
                 name, step, missing.empty() ? -1 : missing.front()},
                -1);
    }
  });
}

void Engine::drop_step(const std::string& name, Param& p, const ErrorMsg& error, int except_rank) {
  log()->warn("{}", error.message);
  metrics_.error(error.code);
  if (p.timer) p.timer->cancel();
  p.timer.reset();
  p.reducer = nullptr;
  (void)name;
  broadcast(p, error, except_rank);
}

void Engine::on_closed(const SessionPtr& s, const std::string& why) {
  sessions_.erase(s->id());
  reports_.erase(s->id());
  const int rank = s->rank;
  if (rank >= 0) {
    auto it = ranks_.find(rank);
    if (it != ranks_.end() && it->second.lock() == s) ranks_.erase(it);
  }
  log()->info("session {} ({}) closed: {}", s->id(), rank_name(rank), why);
  if (rank >= 0 && why != "goodbye" && !stopping_) {
    lost_ranks_[rank] = rank_name(rank) + " (" + s->client_name + ") was lost (" + why + ")";
  }
  for (auto& [name, p] : params_) {
    std::erase_if(p.waiting, [&](const auto& w) {
      auto ws = w.first.lock();
      return !ws || ws == s;
    });
    if (rank < 0 || stopping_ || !p.layout || !p.reducer) continue;
    if (!contributes(*p.layout, rank)) continue;
    const auto missing = p.reducer->missing_ranks();
    if (std::find(missing.begin(), missing.end(), rank) == missing.end()) continue;
    const int64_t step = p.reducer->step();
    drop_step(
        name, p,
        {"peer_lost",
         rank_name(rank) + " (" + s->client_name + ") " +
             (why == "goodbye" ? "left (goodbye)" : "was lost (" + why + ")") + " during step " +
             std::to_string(step) + " of '" + name + "'; partial step dropped, momentum untouched",
         name, step, rank},
        rank);
  }
}

// ---- snapshots, state ------------------------------------------------------------------------

const std::vector<float>& Engine::host_momentum(Param& p) {
  if (p.device && p.layout->spec.options.momentum.convention != MomentumConvention::none) {
    device_->read_momentum(*p.device, 0, static_cast<int64_t>(p.momentum.size()),
                           p.momentum.data());
  }
  return p.momentum;
}

void Engine::write_snapshot_now(const std::string& path) {
  std::vector<SnapshotEntry> entries;
  for (auto& [name, p] : params_) {
    if (!p.layout || p.relay_owner >= 0) continue;  // a relayed momentum is its owner's
    entries.push_back({name, dims_of(p.layout->spec.shape), p.last_step, p.layout->spec.options,
                       host_momentum(p)});
  }
  write_snapshot(path, entries);
  last_snapshot_path_ = path;
  last_snapshot_time_ = std::chrono::system_clock::now();
  log()->info("snapshot of {} parameter(s) written to {}", entries.size(), path);
}

void Engine::on_snapshot(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::SnapshotRequest>(f.payload);
  const std::string path = m.path.empty() ? config_.snapshot_path : m.path;
  if (path.empty()) {
    throw InvalidArgument("snapshot: no path given and the server has no --snapshot path");
  }
  if (any_computing()) {  // never save a half-applied momentum: wait for the work in flight
    snapshot_waiters_.emplace_back(s, std::make_pair(path, f.request_id));
    return;
  }
  try {
    write_snapshot_now(path);
  } catch (const Error& e) {
    reply_error(s, {"snapshot", e.message(), "", -1, -1}, f.request_id);
    return;
  }
  s->send(MessageType::snapshot_ok,
          transport::encode(transport::SnapshotOk{path, static_cast<int>(params_.size())}),
          f.request_id);
}

void Engine::on_state_fetch(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::StateFetch>(f.payload);
  Param* pp = nullptr;
  try {
    pp = &registered_param(m.name, s);
    if (pp->computing) {
      throw InvalidArgument("parameter '" + m.name +
                            "': momentum requested while a step is computing");
    }
  } catch (const InvalidArgument& e) {
    // Named after the parameter, so that only this fetch fails on the client.
    reply_error(s, {"bad_request", e.message(), m.name, -1, s->rank}, f.request_id);
    return;
  }
  Param& p = *pp;
  const int64_t n = p.layout->spec.shape.numel();
  if (p.relay_owner >= 0) {  // the owner's momentum, fetched through the relay
    relay().fetch_momentum(
        p.relay_owner, m.name, n,
        [this, w = std::weak_ptr<Session>(s), name = m.name, request = f.request_id](
            std::vector<float> values, int64_t last, std::optional<ErrorMsg> error) {
          auto ws = w.lock();
          if (!ws || ws->closed()) return;
          if (error) {
            error->param = name;
            reply_error(ws, *error, request);
            return;
          }
          send_momentum(ws, name, last, values.data(), static_cast<int64_t>(values.size()));
        });
    return;
  }
  send_momentum(s, m.name, p.last_step, host_momentum(p).data(), n);
}

void Engine::send_momentum(const SessionPtr& s, const std::string& name, int64_t last_step,
                           const float* momentum, int64_t n) {
  const int64_t per_chunk = static_cast<int64_t>(config_.layout.slot_bytes / 4);
  for (int64_t off = 0; off < n; off += per_chunk) {
    const int64_t count = std::min(per_chunk, n - off);
    std::vector<std::byte> data(static_cast<size_t>(count) * 4);
    std::memcpy(data.data(), momentum + off, data.size());
    transport::Update u;
    u.name = name;
    u.step = last_step;
    u.offset = off;
    u.count = count;
    u.kind = transport::ChunkKind::momentum;
    u.last = off + count == n;
    metrics_.chunk_returned(transport::ChunkKind::momentum, data.size());
    s->send_chunk(std::move(u), std::move(data));
  }
}

std::string Engine::status_json() const {
  using nlohmann::json;
  json j;
  j["server_version"] = "muon-offloadd " MUON_OFFLOAD_VERSION;
  j["backend"] = std::string(scheduler_.backend().name());
  j["uptime_s"] = metrics_.uptime_seconds();
  j["world_size"] = world_size_;
  if (routes_) {
    j["plan"] = {{"path", routes_->source()},
                 {"server_id", routes_->server_id()},
                 {"servers", routes_->servers()},
                 {"world_size", routes_->world_size()},
                 {"relays", routes_->relayed()}};
  }
  j["stopping"] = stopping_;
  j["queued"] = scheduler_.queued();
  int64_t in_flight = 0;
  for (const auto& [name, p] : params_) in_flight += p.computing ? 1 : 0;
  j["in_flight"] = in_flight;
  auto& sessions = j["sessions"] = json::array();
  for (const auto& [id, w] : sessions_) {
    auto s = w.lock();
    if (!s) continue;
    json e{{"id", id},
           {"rank", s->rank},
           {"client", s->client_name},
           {"pending_chunks", s->pending_chunks()}};
    if (auto r = reports_.find(id); r != reports_.end()) {
      e["last_report"] = {{"step", r->second.step},
                          {"exposed_wait_s", static_cast<double>(r->second.exposed_wait_ns) * 1e-9},
                          {"bytes_pushed", r->second.bytes_pushed},
                          {"parameters", r->second.parameters},
                          {"slowest_parameter", r->second.slowest_parameter}};
    }
    sessions.push_back(std::move(e));
  }
  auto& params = j["parameters"] = json::array();
  for (const auto& [name, p] : params_) {
    json e{{"name", name},
           {"registered", p.layout.has_value()},
           {"last_step", p.last_step},
           {"computing", p.computing}};
    if (p.layout) {
      e["shape"] = p.layout->spec.shape.str();
      e["contributors"] = p.layout->contributors;
      e["registrants"] = p.layout->registrants;
      if (p.relay_owner >= 0) e["relayed_to"] = p.relay_owner;  // its owner's server id
    } else if (p.pending) {
      e["missing_ranks"] = p.pending->missing_ranks();  // ranks that have not registered it
    }
    if (p.reducer) {
      e["gathering_step"] = p.reducer->step();
      e["missing_ranks"] = p.reducer->missing_ranks();
    }
    if (p.health) {
      json h{{"step", p.health_step}, {"nonfinite", p.health->nonfinite}};
      if (std::isnan(p.health->orthogonality_error)) {
        h["orthogonality_error"] = nullptr;
      } else {
        h["orthogonality_error"] = p.health->orthogonality_error;
      }
      e["health"] = std::move(h);
    }
    params.push_back(std::move(e));
  }
  auto& errors = j["errors"] = json::object();
  for (const auto& [code, n] : metrics_.error_counts()) errors[code] = static_cast<int64_t>(n);
  if (last_snapshot_time_) {
    const auto t = *last_snapshot_time_;
    j["last_snapshot"] = {
        {"path", last_snapshot_path_},
        {"unix_time", std::chrono::duration<double>(t.time_since_epoch()).count()},
        {"age_s", std::chrono::duration<double>(std::chrono::system_clock::now() - t).count()}};
  } else {
    j["last_snapshot"] = nullptr;
  }
  j["snapshot_path"] = config_.snapshot_path;
  j["metrics_url"] = metrics_url_;
  j["health_sample_every"] = config_.health_sample_every;
  return j.dump();
}

void Engine::refresh_metrics() {
  MetricsState st;
  for (const auto& [id, w] : sessions_) {
    auto s = w.lock();
    if (!s || s->closed()) continue;
    ++st.sessions_open;
    if (s->rank >= 0) ++st.clients_connected;
  }
  for (const auto& [name, p] : params_) {
    if (!p.layout) continue;
    ++st.parameters_registered;
    st.scheduler_in_flight += p.computing ? 1 : 0;
    st.gathering += p.reducer ? 1 : 0;
    st.momentum_bytes += static_cast<int64_t>(p.momentum.size() * sizeof(float));
  }
  st.scheduler_queued = static_cast<int64_t>(scheduler_.queued());
  st.last_snapshot = last_snapshot_time_;
  metrics_.set_state(st);
}

void Engine::observe_health(const std::string& name, Param& p, const NsJob& job) {
  const NumericHealth& h = *job.health;
  metrics_.health(name, h);
  p.health = h;
  p.health_step = job.step;
  if (!p.health_threshold) {
    p.health_threshold = config_.health_warn_threshold
                             ? *config_.health_warn_threshold
                             : default_health_threshold(job.options.orthogonalize);
  }
  const double limit = *p.health_threshold;
  const bool bad = h.nonfinite > 0 || !(h.orthogonality_error <= limit);
  if (bad && !p.unhealthy) {
    // Once per episode: again only after a sample back within the threshold.
    log()->warn(
        "parameter '{}' step {}: numeric health: orthogonality error {:.4g} (threshold {:.4g}, "
        "||X X^T - I||_F/sqrt(m) of the unscaled Newton-Schulz output, schedule {}), {} "
        "non-finite value(s)",
        name, job.step, h.orthogonality_error, limit, job.options.orthogonalize.schedule,
        h.nonfinite);
  } else if (!bad && p.unhealthy) {
    log()->info("parameter '{}' step {}: numeric health back within the threshold ({:.4g})", name,
                job.step, h.orthogonality_error);
  }
  p.unhealthy = bad;
}

// ---- shutdown --------------------------------------------------------------------------------

void Engine::shutdown(std::function<void()> done) {
  stopping_ = true;
  shutdown_done_ = std::move(done);
  // Steps still being gathered are aborted: nothing of them reached the momentum.
  for (auto& [name, p] : params_) {
    if (p.reducer) {
      drop_step(name, p,
                {"shutdown",
                 "server shutting down: step " + std::to_string(p.reducer->step()) + " of '" +
                     name + "' aborted, momentum untouched",
                 name, p.reducer->step(), -1},
                -1);
    }
    if (p.timer) p.timer->cancel();
  }
  maybe_finish_shutdown();
}

void Engine::maybe_finish_shutdown() {
  if (!stopping_ || !shutdown_done_ || any_computing()) return;
  if (!config_.snapshot_path.empty()) {
    try {
      write_snapshot_now(config_.snapshot_path);
    } catch (const Error& e) {
      log()->error("final snapshot failed: {}", e.what());
    }
  }
  std::vector<SessionPtr> open;  // close() re-enters on_closed, which edits sessions_
  for (auto& [id, w] : sessions_) {
    if (auto s = w.lock()) open.push_back(s);
  }
  for (auto& s : open) {
    s->send_error({"shutdown", "server shutting down", "", -1, -1});
    s->close("server shutdown");
  }
  scheduler_.stop();
  auto done = std::move(shutdown_done_);
  shutdown_done_ = nullptr;
  done();
}

}  // namespace muon::daemon
