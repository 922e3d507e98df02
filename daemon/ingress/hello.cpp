// Hello: the TCP token, the job's world size, one session per rank, and the session's data plane
// (shared memory, exported device rings, or NCCL communicators being joined).
#include "daemon/engine.hpp"


#include "core/error.hpp"
#include "daemon/log.hpp"
#include "daemon/planes/device_ring_plane.hpp"
#include "daemon/planes/shm_plane.hpp"
#include "transport/auth_token.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::Frame;
using transport::MessageType;

size_t Engine::pre_hello_tcp_sessions() const {
  size_t n = 0;
  for (const auto& [id, w] : sessions_) {
    if (auto s = w.lock(); s && s->tcp && s->rank < 0 && !s->closed()) ++n;
  }
  return n;
}

bool Engine::open_data_plane(const SessionPtr& s, const transport::Hello& m, transport::HelloOk& ok,
                             uint32_t request_id) {
  if (m.data_plane != transport::DataPlane::shm) {
    const char* plane_name = transport::data_plane_name(m.data_plane);
    if (!device_) {
      reply_error(s,
                  {ErrorCode::unsupported,
                   std::string("data plane ") + plane_name +
                       " needs a server on the CUDA backend with its GPU data plane (this one "
                       "runs the " +
                       std::string(scheduler_.backend().name()) + " backend" +
                       (config_.host_staging ? " with --host-staging" : "") +
                       "); connect with data plane shm",
                   "", -1, m.rank},
                  request_id);
      return false;
    }
    std::unique_ptr<ServerPlane> plane;
    try {
      plane = m.data_plane == transport::DataPlane::nccl
                  ? make_nccl_plane(*device_, config_.layout)
                  : make_cuda_ipc_plane(*device_, config_.layout);
    } catch (const BackendUnavailable& e) {
      reply_error(s, {ErrorCode::unsupported, e.message(), "", -1, m.rank}, request_id);
      return false;
    }
    s->use_plane(std::move(plane));
  } else {
    s->use_plane(make_shm_plane(config_.layout, device_.get()));
  }
  ServerPlane& plane = *s->plane();
  plane.describe(ok);
  // A plane that gets ready later (nccl: the client joins both communicators once it has the
  // ids, the server drops one that does not within the step timeout) holds the session's
  // data-plane frames, and its results wait as host bytes, until then. `done` runs on the
  // plane's thread, which the DevicePlane joins before it goes; `alive_` (gone first in
  // ~Engine) keeps one that ends during teardown from posting.
  std::weak_ptr<Session> weak = s;
  std::weak_ptr<bool> alive = alive_;
  const bool ready = plane.start(
      config_.step_timeout,
      [&io = io_, weak, alive, kind = plane.kind()](std::optional<transport::ErrorMsg> error) {
        if (alive.expired()) return;
        asio::post(io, [weak, alive, kind, error = std::move(error)]() mutable {
          auto ss = weak.lock();
          if (!ss || alive.expired()) return;
          if (!error) {
            ss->set_data_plane_ready();
            return;
          }
          log()->warn("session {}: its {} data plane did not start: {}", ss->id(),
                      transport::data_plane_name(kind), error->message);
          error->rank = ss->rank;
          ss->send_error(*error);
          ss->close("data plane did not start");
        });
      });
  if (!ready) s->hold_data_plane();
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
                {ErrorCode::unauthorized,
                 "hello over TCP needs the server's token (--auth-token-file)", "", -1, m.rank},
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
        " ranks, rank " + std::to_string(m.rank) + " says " + std::to_string(m.world_size) +
        " (a job of another size is taken once every rank of this one has left)");
  }
  if (auto other = session_of(m.rank)) {
    // Sessions are keyed by rank: a second optimizer of one trainer process (or a second job)
    // arrives as the same rank. Say so, with both clients' own words (their pids).
    throw transport::ProtocolError(
        "rank " + std::to_string(m.rank) + " is already connected (session " +
        std::to_string(other->id()) + ", '" + other->client_name + "'; this hello: '" + m.client +
        "'): a server serves one connection per rank, so one optimizer per trainer process and "
        "one job at a time. In one process: close() the optimizer that is done with, or put the "
        "second one's parameters into the first as another param group (with names of their "
        "own); another job needs a server of its own");
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
  ok.snapshot_path = config_.snapshot_path;
  ok.snapshot_every = config_.snapshot_every;
  log()->info("session {}: {} of {} connected ({}, data plane {})", s->id(), rank_name(m.rank),
              m.world_size, m.client, transport::data_plane_name(ok.data_plane));
  s->send(MessageType::hello_ok, transport::encode(ok), f.request_id);
  for (auto& [name, p] : params_) {
    if (p.layout && !p.waiting.empty()) release_reregistrations(p);
  }
}

}  // namespace muon::daemon
