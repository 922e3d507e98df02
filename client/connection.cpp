#include "client/connection.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "client/device_scope.hpp"
#include "transport/endpoint.hpp"

namespace muon::client {

namespace asio = boost::asio;
using transport::MessageType;

namespace {

// Empties a PushBatch when the scope ends, after its bytes were written (or the write failed: the
// connection is lost, and the frames must not go out again ahead of later ones).
struct ClearAfter {
  PushBatch& batch;
  ~ClearAfter() { batch.clear(); }
};

std::string ms_text(std::chrono::milliseconds ms) {
  return std::to_string(ms.count()) + " ms";
}

// What of a server's momentum outlives it, as its hello said (a server that does not say: "").
// A stopped server (SIGTERM) writes its --snapshot; a crashed one keeps only what is on disk.
std::string crash_note(const transport::HelloOk& ok) {
  if (ok.server_version.empty()) return "";
  if (ok.snapshot_path.empty()) {
    return ". This server has no --snapshot: its momentum is gone with it (stopped or crashed)";
  }
  if (ok.snapshot_every > 0) {
    const auto n = std::to_string(ok.snapshot_every);
    return ". This server snapshots every " + (ok.snapshot_every == 1 ? "step" : n + " steps") +
           " to " + ok.snapshot_path +
           ": if it crashed, the momentum of the steps since its last snapshot is gone (at most " +
           n + ", more only if it crashed while writing one or its disk fell behind: see its " +
           "log); if it was stopped, its final snapshot holds every step";
  }
  return ". This server writes " + ok.snapshot_path +
         " only on request and when stopped: if it crashed, the momentum of every step since the "
         "last requested snapshot is gone";
}

}  // namespace

Connection::Connection(std::string endpoint, int rank, int world_size,
                       const std::string& client_name, std::chrono::milliseconds connect_timeout,
                       std::chrono::milliseconds op_timeout, transport::DataPlane data_plane,
                       const std::string& auth_token)
    : path_(std::move(endpoint)),
      rank_(rank),
      op_timeout_(op_timeout),
      socket_(io_),
      data_plane_(data_plane) {
  const transport::Endpoint where = transport::parse_endpoint(path_);
  require_plane_built(data_plane, path_);
  const auto address = transport::resolve(where, io_);
  const auto give_up = Clock::now() + connect_timeout;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    boost::system::error_code ec;
    socket_.connect(address, ec);
    if (!ec) break;
    boost::system::error_code ignored;
    socket_.close(ignored);
    if (Clock::now() + backoff > give_up) {
      throw ConnectionLost("cannot connect to muon-offloadd at '" + path_ + "' within " +
                           ms_text(connect_timeout) + ": " + ec.message() +
                           " (is the server running? see `muon-offloadd --help`)");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  transport::tune_connected(socket_, where);
  reader_ = std::thread([this] { reader_loop(); });
  try {
    // The token proves a TCP peer; a Unix socket peer is checked by uid and never gets it.
    const auto id = send_request(MessageType::hello,
                                 transport::encode(transport::Hello{
                                     rank, world_size, client_name, data_plane,
                                     where.is_tcp() ? auth_token : std::string()}));
    const auto ok = transport::decode<transport::HelloOk>(wait_reply(id, "hello").payload);
    if (ok.data_plane != data_plane) {
      throw ServerError("muon-offloadd at '" + path_ + "' answered a hello asking for data plane " +
                            transport::data_plane_name(data_plane) + " with data plane " +
                            transport::data_plane_name(ok.data_plane) +
                            " (a server that predates the choice of data plane?)",
                        ErrorCode::unsupported, "", -1, -1);
    }
    auto plane = make_client_plane(ok, path_, op_timeout);
    std::lock_guard lk(mu_);
    plane_ = std::move(plane);
    chunk_bytes_ = transport::push_chunk_bytes(ok);
    crash_note_ = crash_note(ok);
    if (!ok.server_version.empty()) snapshot_config_.emplace(ok.snapshot_path, ok.snapshot_every);
    tx_credits_.assign(ok.tx_slots);
    if (auto words = plane_->tx_credit_words()) {
      tx_credits_.use_segment(*words);
      // No frame has been pushed yet, so write_mu_ guards nothing here.
      batch_pushes_ = true;
      push_batch_ = PushBatch(kPushBatchBytes, std::max<uint32_t>(1, ok.tx_slots / 2));
    }
  } catch (...) {
    boost::system::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_both, ignored);
    if (reader_.joinable()) reader_.join();
    throw;
  }
}

Connection::~Connection() {
  {
    // A plane that maps the server's memory (cuda_ipc) goes before the goodbye: the server frees
    // the exported rings once the session closes, and CUDA leaves freeing memory another process
    // still maps undefined. The reader uses the plane under mu_ and ignores data-plane frames
    // once closing_ is set.
    std::lock_guard lk(mu_);
    closing_ = true;
    if (plane_->maps_server_memory()) {
      params_.clear();  // the holds (each waits for its pending copies)
      plane_.reset();   // waits for its streams and copies, unmaps the rings
    }
  }
  bool said_goodbye = false;
  try {
    if (lost_reason().empty()) {
      send_frame(MessageType::goodbye, "{}");
      said_goodbye = true;
    }
  } catch (...) {
  }
  boost::system::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  if (reader_.joinable()) reader_.join();
  socket_.close(ignored);
  // Any other plane is the client's own memory (nccl: its communicators); it goes once the
  // reader is gone, its transfers ended first (aborted when the server is gone: the connection
  // was lost, or the goodbye did not go out) and only then the holds.
  if (plane_) plane_->finish(!said_goodbye);
  params_.clear();
  plane_.reset();
}

std::optional<std::pair<std::string, int64_t>> Connection::snapshot_config() {
  std::lock_guard lk(mu_);
  return snapshot_config_;
}

std::string Connection::lost_reason() {
  std::lock_guard lk(mu_);
  return lost_;
}

std::map<int, std::string> Connection::lost_peers() {
  std::lock_guard lk(mu_);
  return lost_peers_;
}

void Connection::throw_lost(const std::string& what) {
  throw ConnectionLost("connection to muon-offloadd at '" + path_ + "' lost (" + lost_ +
                       ") while " + what + crash_note_);
}

void Connection::lose(const std::string& why) {
  {
    std::lock_guard lk(mu_);
    if (lost_.empty()) lost_ = why;
    // Transfers queued for a server that is gone would spin on their streams (the trainer's
    // among them) forever: abort them (nccl).
    if (plane_) plane_->abort();
    cv_.notify_all();
  }
  boost::system::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
}

StreamHandle Connection::push_stream() const {
  return plane_->push_stream();
}

template <class Buffers>
void Connection::write_locked(const Buffers& buffers, uint16_t what) {
  boost::system::error_code ec;
  asio::write(socket_, buffers, ec);
  if (ec) {
    std::unique_lock lk2(mu_);
    // The reader gets the server's last frames (an error that says why) before EOF: wait for
    // it, bounded (the reader may itself wait for write_mu_, held here, to send an ack).
    cv_.wait_for(lk2, kLostReasonWait, [&] { return !lost_.empty(); });
    if (lost_.empty()) lost_ = "write failed: " + ec.message();
    cv_.notify_all();
    throw ConnectionLost("connection to muon-offloadd at '" + path_ + "' lost (" + lost_ +
                         ") while sending " + transport::message_type_name(what) + crash_note_);
  }
}

void Connection::send_frame(MessageType type, const std::string& payload, uint32_t id) {
  const auto bytes =
      transport::encode_frame(transport::Frame{static_cast<uint16_t>(type), id, payload});
  std::lock_guard lk(write_mu_);
  if (push_batch_.empty()) {
    write_locked(asio::buffer(bytes), static_cast<uint16_t>(type));
    return;
  }
  // The held pushes first, in the same write: a commit never overtakes its step's chunks.
  const ClearAfter clear{push_batch_};
  const std::array<asio::const_buffer, 2> both{asio::buffer(push_batch_.bytes()),
                                               asio::buffer(bytes)};
  write_locked(both, static_cast<uint16_t>(type));
}

void Connection::send_push_frame(const transport::Push& m, uint64_t chunk_bytes) {
  const auto bytes = transport::encode_frame(
      transport::Frame{static_cast<uint16_t>(MessageType::push), 0, transport::encode(m)});
  std::lock_guard lk(write_mu_);
  if (!push_batch_.add(bytes, chunk_bytes)) return;
  const ClearAfter clear{push_batch_};
  write_locked(asio::buffer(push_batch_.bytes()), static_cast<uint16_t>(MessageType::push));
}

void Connection::send_held_pushes() noexcept {
  std::lock_guard lk(write_mu_);
  if (push_batch_.empty()) return;
  const ClearAfter clear{push_batch_};  // written or lost: either way not written again
  try {
    write_locked(asio::buffer(push_batch_.bytes()), static_cast<uint16_t>(MessageType::push));
  } catch (const ConnectionLost&) {  // lost_ says so; the caller's wait reports it
  }
}

uint32_t Connection::send_request(MessageType type, const std::string& payload) {
  uint32_t id;
  {
    std::lock_guard lk(mu_);
    id = next_request_++;
    replies_[id] = Reply{};
  }
  send_frame(type, payload, id);
  return id;
}

transport::Frame Connection::wait_reply(uint32_t id, const std::string& what) {
  return wait_reply_until(id, what, deadline());
}

transport::Frame Connection::wait_reply_until(uint32_t id, const std::string& what,
                                              Clock::time_point until) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_until(lk, until, [&] { return replies_[id].done || !lost_.empty(); })) {
    replies_.erase(id);
    throw Timeout("no answer from muon-offloadd at '" + path_ + "' within " + ms_text(op_timeout_) +
                  " to " + what);
  }
  Reply r = std::move(replies_[id]);
  replies_.erase(id);
  if (r.error) {
    throw ServerError("muon-offloadd at '" + path_ + "' refused " + what + ": " + r.error->message,
                      r.error->code, r.error->param, r.error->step, r.error->rank);
  }
  if (!r.done) throw_lost(what);
  return std::move(r.frame);
}

uint32_t Connection::send_register(const transport::RegisterParam& reg) {
  return send_request(MessageType::register_param, transport::encode(reg));
}

transport::RegisterOk Connection::wait_register(uint32_t id, const std::string& name) {
  try {
    return transport::decode<transport::RegisterOk>(
        wait_reply(id, "the registration of '" + name + "'").payload);
  } catch (const Timeout& e) {
    // A registration waits for every rank of the job: say which ones it still waits for.
    throw Timeout(e.message() + server_progress(name));
  }
}

std::string Connection::server_progress(const std::string& name, int64_t step) {
  try {
    const auto id = send_request(MessageType::status, "");
    const auto status = nlohmann::json::parse(
        wait_reply_until(id, "a status", Clock::now() + std::chrono::seconds(1)).payload);
    const std::string world = std::to_string(status.value("world_size", 0));
    for (const auto& p : status.at("parameters")) {
      if (p.at("name") != name) continue;
      std::string ranks;
      for (const auto& r : p.value("missing_ranks", nlohmann::json::array())) {
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r.get<int>());
      }
      if (step < 0) {
        if (p.value("registered", true) || ranks.empty()) return "";
        return "; ranks " + ranks + " of the job's " + world +
               " have not registered it (a registration waits for every rank of the job: start "
               "them all, each registering the same parameters)";
      }
      if (p.contains("gathering_step") && !ranks.empty()) {
        // A step the server is still gathering: the ranks named have not pushed or committed.
        char since[32];
        std::snprintf(since, sizeof since, "%.1f", p.value("gathering_for_s", 0.0));
        return "; the server is gathering its step " +
               std::to_string(p.at("gathering_step").get<int64_t>()) + " since " + since +
               " s and still waits for ranks " + ranks + " of the job's " + world +
               " (a rank that has not called backward or step() for it, or is stalled: look at "
               "it; the server's own --step-timeout-ms then fails the step naming it)";
      }
      const std::string phase = p.value("phase", "");
      if (phase == "computing" || phase == "replicating") {
        return "; the server is still " + phase + " it (a slow server, or a wait too short for "
               "its Newton-Schulz: raise the timeout)";
      }
      return "; the server's last step of it is " +
             std::to_string(p.value("last_step", int64_t{-1})) + " (" + phase + ")";
    }
  } catch (const std::exception&) {
    // No status within the second, or not the expected one: the timeout says enough.
  }
  return "";
}

void Connection::expect_updates(const std::string& name, std::vector<transport::Range> want,
                                size_t elem_bytes, bool packed) {
  std::lock_guard lk(mu_);
  auto& p = params_[name];
  p.want = RangeSet::union_of(std::move(want));
  p.packed = packed;
  p.elem_bytes = elem_bytes;
  p.receiving_step = -1;
  p.complete.clear();
  p.receiving.reset();  // the reader makes holds of the new size
  p.spare.clear();
}

SendChunks Connection::chunker(const std::string& name, int64_t step, int64_t offset,
                               int64_t count, size_t elem_bytes, transport::ChunkKind kind) {
  return [=, this](const ChunkMoves& moves) {
    return push_chunks(name, step, offset, count, elem_bytes, kind, moves);
  };
}

int64_t Connection::push(const std::string& name, int64_t step, int64_t offset,
                         const std::byte* data, int64_t count, size_t elem_bytes,
                         transport::ChunkKind kind) {
  return plane_->push_host(data, elem_bytes,
                           chunker(name, step, offset, count, elem_bytes, kind));
}

int64_t Connection::push_device(const std::string& name, int64_t step, int64_t offset,
                             const std::byte* device_data, int64_t count, size_t elem_bytes,
                             transport::ChunkKind kind, StreamHandle stream) {
  if (!on_device()) {
    throw InvalidArgument("push_device of '" + name + "' to '" + path_ +
                          "': the session's data plane is shm, not cuda_ipc or nccl");
  }
  // Imported events and NCCL calls work on the plane's device; the caller's device comes back.
  DeviceScope scope(plane_->device());
  require_stream_on_device(stream, plane_->device(), scope.previous(),
                           "push_device of '" + name + "' to '" + path_ + "'");
  return plane_->push_device(device_data, elem_bytes, stream,
                             chunker(name, step, offset, count, elem_bytes, kind));
}

int64_t Connection::push_chunks(const std::string& name, int64_t step, int64_t offset,
                                int64_t count, size_t elem_bytes, transport::ChunkKind kind,
                                const ChunkMoves& moves) {
  const int64_t per_slot = static_cast<int64_t>(chunk_bytes_ / elem_bytes);
  const uint32_t attempt = attempt_of(name, step);
  const uint32_t param_id = wire_id(name, kind);
  int64_t frames = 0;
  for (int64_t done = 0; done < count || (count == 0 && done == 0); done += per_slot) {
    const int64_t n = std::min(per_slot, count - done);
    const uint32_t slot = take_tx_credit(name, step);
    try {
      if (moves.into_slot) moves.into_slot(slot, done, n);
    } catch (...) {
      std::lock_guard lk(mu_);
      tx_credits_.give_back(slot);  // nothing announced: the credit is still ours
      cv_.notify_all();
      throw;
    }
    transport::Push m{name, step, offset + done, n, slot, kind, attempt, param_id};
    if (moves.after_frame) {
      // The server posts its ncclRecv when it reads the frame, so the send follows the frame
      // (NCCL connects a pair lazily, on the first transfer both sides have posted) and the
      // sends of several pushing threads go in the frames' order.
      std::lock_guard order(after_frame_mu_);
      send_frame(MessageType::push, transport::encode(m));
      try {
        moves.after_frame(done, n);
      } catch (const Error& e) {
        lose(std::string("the ") + transport::data_plane_name(data_plane_) +
             " data plane failed: " + e.what());
        throw;
      }
    } else if (batch_pushes_ && kind == transport::ChunkKind::gradient) {
      send_push_frame(m, static_cast<uint64_t>(n) * elem_bytes);
    } else {
      send_frame(MessageType::push, transport::encode(m));
    }
    ++frames;
    if (count == 0) break;
  }
  return frames;
}

uint32_t Connection::take_tx_credit(const std::string& name, int64_t step) {
  using IfNot = transport::CreditRing::IfNot;
  {
    std::lock_guard lk(mu_);
    if (lost_.empty()) {
      if (auto slot = tx_credits_.acquire()) return *slot;
    }
  }
  send_held_pushes();  // the server frees no slot whose push frame it has not read
  std::unique_lock lk(mu_);
  if (tx_credits_.in_segment()) {
    const auto spin_until = Clock::now() + kCreditSpin;
    for (;;) {
      if (!lost_.empty()) throw_lost("pushing '" + name + "'");
      if (auto slot = tx_credits_.acquire()) return *slot;  // reads the words back
      if (Clock::now() >= spin_until) break;
      lk.unlock();
      std::this_thread::yield();  // the server's io thread may need this core
      lk.lock();
    }
  }
  if (!cv_.wait_until(lk, deadline(), [&] {
        return tx_credits_.any_free(IfNot::ask_wake) || !lost_.empty();
      })) {
    throw Timeout("no free " + std::string(transport::data_plane_name(data_plane_)) +
                  " ring slot to push '" + name + "' step " + std::to_string(step) + " within " +
                  ms_text(op_timeout_) + " (the server is not draining the ring)");
  }
  if (!lost_.empty()) throw_lost("pushing '" + name + "'");
  return *tx_credits_.acquire();  // any_free() held under the same lock
}

uint32_t Connection::wire_id(const std::string& name, transport::ChunkKind kind) {
  if (kind == transport::ChunkKind::replica_momentum ||
      kind == transport::ChunkKind::replica_update) {
    return transport::kNoParamId;  // the chunk carries the name (its seal follows)
  }
  std::lock_guard lk(mu_);
  auto it = param_ids_.find(name);
  // No id: a parameter whose registration was not answered here; the name travels and the
  // server refuses it by name (unknown parameter, not part of it).
  return it == param_ids_.end() ? transport::kNoParamId : it->second;
}

uint32_t Connection::attempt_of(const std::string& name, int64_t step) {
  std::lock_guard lk(mu_);
  auto it = params_.find(name);
  return it != params_.end() && it->second.retry_step == step ? it->second.retry_attempt : 0;
}

void Connection::commit(const std::string& name, int64_t step) {
  send_frame(MessageType::commit,
             transport::encode(transport::Commit{name, step, attempt_of(name, step)}));
}

void Connection::flush() {
  const auto until = deadline();
  for (;;) {
    // Again at every look: another thread may push (and hold a frame) while this one waits.
    send_held_pushes();
    std::unique_lock lk(mu_);
    const bool ok = cv_.wait_until(lk, std::min(until, Clock::now() + kFlushRecheck), [&] {
      return tx_credits_.all_free(transport::CreditRing::IfNot::ask_wake) || !lost_.empty();
    });
    if (!lost_.empty()) throw_lost("flushing pushed data");
    if (ok) return;
    if (Clock::now() >= until) {
      throw Timeout("pushed data not consumed by '" + path_ + "' within " + ms_text(op_timeout_));
    }
  }
}

bool Connection::update_ready(const std::string& name, int64_t step) {
  std::lock_guard lk(mu_);
  auto it = params_.find(name);
  return it != params_.end() && it->second.complete.count(step) != 0;
}

UpdateState Connection::update_state(const std::string& name, int64_t step) {
  std::lock_guard lk(mu_);
  auto it = params_.find(name);
  if (it == params_.end()) return lost_.empty() ? UpdateState::pending : UpdateState::lost;
  const auto& p = it->second;
  // In take_update's order: an error first, then the values, then the lost connection.
  if (p.errors.count(step) != 0 || p.errors.count(-1) != 0) return UpdateState::failed;
  if (p.complete.count(step) != 0 || step <= p.dropped_through) return UpdateState::complete;
  return lost_.empty() ? UpdateState::pending : UpdateState::lost;
}

bool Connection::wait_update(const std::string& name, int64_t step, std::byte* dst) {
  return take_update(name, step, [&](ParamRx::Complete& c) { c.values->copy_to_host(dst); });
}

bool Connection::wait_update_device(const std::string& name, int64_t step, std::byte* device_dst,
                                    StreamHandle stream) {
  if (!on_device()) {
    throw InvalidArgument("wait_update_device of '" + name + "' from '" + path_ +
                          "': the session's data plane is shm, not cuda_ipc or nccl");
  }
  // As push_device: the holding buffer's events belong to the plane's device, and a null stream
  // means the legacy stream of the device current at the call (gpu-review F5). Checked before
  // anything is taken: a failure leaves the update held.
  DeviceScope scope(plane_->device());
  require_stream_on_device(stream, plane_->device(), scope.previous(),
                           "wait_update_device of '" + name + "' from '" + path_ + "'");
  return take_update(name, step,
                     [&](ParamRx::Complete& c) { c.values->copy_to_device(device_dst, stream); });
}

bool Connection::take_update(const std::string& name, int64_t step,
                             const std::function<void(ParamRx::Complete&)>& take) {
  send_held_pushes();  // an update may need them (a commit sent them already, as a rule)
  std::unique_lock lk(mu_);
  auto it = params_.find(name);
  if (it == params_.end()) {
    throw InvalidArgument("parameter '" + name + "' is not registered with '" + path_ + "'");
  }
  auto& p = it->second;
  auto error_for = [&]() -> const transport::ErrorMsg* {
    for (int64_t key : {step, int64_t{-1}}) {
      if (auto e = p.errors.find(key); e != p.errors.end()) return &e->second;
    }
    return nullptr;
  };
  const bool ok = cv_.wait_until(lk, deadline(), [&] {
    return p.complete.count(step) != 0 || step <= p.dropped_through || error_for() != nullptr ||
           !lost_.empty();
  });
  if (const auto* e = error_for()) {
    ServerError err("muon-offloadd at '" + path_ + "': " + e->message, e->code, e->param, e->step,
                    e->rank);
    p.errors.clear();
    // The caller now knows this step failed; what it pushes for the step from here on is a
    // new try, and the server must not add it to chunks of the failed one still in flight.
    p.retry_attempt = p.retry_step == step ? p.retry_attempt + 1 : 1;
    p.retry_step = step;
    throw err;
  }
  if (auto c = p.complete.find(step); c != p.complete.end()) {
    take(c->second);
    const bool applied = c->second.applied;
    // This step and every earlier one are done with: recycle their buffers.
    for (auto d = p.complete.begin(); d != p.complete.end() && d->first <= step;) {
      p.spare.push_back(std::move(d->second.values));
      d = p.complete.erase(d);
    }
    return applied;
  }
  if (!lost_.empty())
    throw_lost("waiting for the update of '" + name + "' step " + std::to_string(step));
  (void)ok;
  if (step <= p.dropped_through) {
    throw InvalidArgument("the update of '" + name + "' step " + std::to_string(step) +
                          " was dropped unread: more than " + std::to_string(kMaxHeldUpdates) +
                          " later steps arrived before it was asked for");
  }
  lk.unlock();  // server_progress sends a request and waits for its answer
  throw Timeout("the update of '" + name + "' step " + std::to_string(step) +
                " did not arrive from '" + path_ + "' within " + ms_text(op_timeout_) +
                server_progress(name, step));
}

std::vector<float> Connection::fetch_momentum(const std::string& name, int64_t numel,
                                              int64_t* last_step, int64_t after_step) {
  {
    std::lock_guard lk(mu_);
    auto& p = params_[name];
    p.momentum.assign(static_cast<size_t>(numel), 0.0f);
    p.momentum_ready = false;
  }
  send_frame(MessageType::state_fetch,
             transport::encode(transport::StateFetch{name, after_step}));
  std::unique_lock lk(mu_);
  auto& p = params_[name];
  const bool ok = cv_.wait_until(
      lk, deadline(), [&] { return p.momentum_ready || p.errors.count(-1) || !lost_.empty(); });
  if (auto e = p.errors.find(-1); e != p.errors.end()) {
    ServerError err("muon-offloadd at '" + path_ + "': " + e->second.message, e->second.code, name,
                    -1, -1);
    p.errors.erase(e);
    throw err;
  }
  if (!p.momentum_ready) {
    if (!lost_.empty()) throw_lost("fetching the momentum of '" + name + "'");
    (void)ok;
    throw Timeout("momentum of '" + name + "' not received within " + ms_text(op_timeout_));
  }
  if (last_step) *last_step = p.momentum_step;
  return std::move(p.momentum);
}

std::string Connection::snapshot(const std::string& path) {
  const auto id =
      send_request(MessageType::snapshot, transport::encode(transport::SnapshotRequest{path}));
  return transport::decode<transport::SnapshotOk>(wait_reply(id, "a snapshot").payload).path;
}

transport::HealthOk Connection::health() {
  const auto id = send_request(MessageType::health, "{}");
  return transport::decode<transport::HealthOk>(wait_reply(id, "a health check").payload);
}

void Connection::send_step_report(const transport::StepReport& report) {
  send_frame(MessageType::step_report, transport::encode(report));
}

void Connection::set_update_callback(UpdateCallback cb) {
  std::lock_guard lk(mu_);
  callback_ = std::move(cb);
}

// ---- reader thread ---------------------------------------------------------------------------

void Connection::reader_loop() {
  transport::FrameDecoder decoder;
  std::vector<std::byte> buf(64 * 1024);
  for (;;) {
    boost::system::error_code ec;
    const size_t n = socket_.read_some(asio::buffer(buf), ec);
    std::string why;
    if (ec) {
      why = ec == asio::error::eof ? "the server closed the connection" : ec.message();
    } else {
      try {
        decoder.feed(buf.data(), n);
        while (auto f = decoder.next()) handle(std::move(*f));
        continue;
      } catch (const DeviceError& e) {
        why = std::string("the device data plane failed: ") + e.what();
      } catch (const std::exception& e) {
        why = std::string("bad data from the server: ") + e.what();
      }
    }
    std::lock_guard lk(mu_);
    if (lost_.empty()) lost_ = stopped_why_.empty() ? why : stopped_why_;
    if (plane_ && !closing_) plane_->abort();  // the server is gone (see lose())
    cv_.notify_all();
    return;
  }
}

void Connection::handle(transport::Frame f) {
  const auto type = static_cast<MessageType>(f.type);
  if (type == MessageType::update) {
    handle_update(transport::decode<transport::Update>(f.payload));  // resolves its param_id
    return;
  }
  std::lock_guard lk(mu_);
  switch (type) {
    case MessageType::push_ack: {
      // An ack for a slot not held changes nothing; on shm it only wakes the pusher (the
      // slot's release is in the segment's credit words).
      const auto slot = transport::decode<transport::SlotAck>(f.payload).slot;
      (void)tx_credits_.release(slot);
      break;
    }
    case MessageType::error: {
      auto e = transport::decode<transport::ErrorMsg>(f.payload);
      // A server that shuts down closes the connection once its steps in flight are answered:
      // that will be why it is lost.
      if (e.code == ErrorCode::shutdown && stopped_why_.empty()) stopped_why_ = e.message;
      if (f.request_id != 0 && replies_.count(f.request_id)) {
        replies_[f.request_id].error = e;
        replies_[f.request_id].done = true;
      } else if (!e.param.empty()) {
        params_[e.param].errors.emplace(e.step, e);  // the first error of a step is its cause
      } else if (e.code == ErrorCode::peer_lost && e.rank >= 0) {
        // A rank of this job was lost (between steps too): said now, whatever the trainer is
        // blocked in; a step that needs the rank fails with its own error.
        std::fprintf(stderr, "muon-offload: server '%s': %s\n", path_.c_str(), e.message.c_str());
        lost_peers_[e.rank] = "muon-offloadd at '" + path_ + "': " + e.message;
      } else {
        // Not about one parameter (shutdown, protocol): every waiter should see it.
        for (auto& [name, p] : params_) p.errors[-1] = e;
        if (e.code == ErrorCode::shutdown && lost_.empty()) lost_ = e.message;  // and why
      }
      break;
    }
    case MessageType::register_ok: {
      // The id this connection's chunks name the parameter by (none for a replica seal).
      const auto ok = transport::decode<transport::RegisterOk>(f.payload);
      if (ok.param_id != transport::kNoParamId) {
        param_ids_[ok.name] = ok.param_id;
        param_names_[ok.param_id] = ok.name;
      }
      [[fallthrough]];
    }
    default:
      if (f.request_id != 0 && replies_.count(f.request_id)) {
        replies_[f.request_id].frame = std::move(f);
        replies_[f.request_id].done = true;
      }
      break;
  }
  cv_.notify_all();
}

void Connection::handle_update(transport::Update u) {
  UpdateCallback cb;
  bool complete = false;
  {
    std::lock_guard lk(mu_);
    // The plane is gone (or not there yet); the session is about to be.
    if (closing_ || !plane_) return;
    if (u.param_id != transport::kNoParamId) {
      auto id = param_names_.find(u.param_id);
      if (id == param_names_.end()) {
        throw transport::ProtocolError("update names parameter id " + std::to_string(u.param_id) +
                                       ", which the server never handed out on this connection");
      }
      u.name = id->second;
    }
    plane_->enter_reader_thread();
    auto& p = params_[u.name];
    if (u.kind == transport::ChunkKind::momentum) {
      const bool inside =
          u.offset >= 0 && u.offset + u.count <= static_cast<int64_t>(p.momentum.size());
      // Received whatever happens to it (nccl: the server sent it, a matching receive is due).
      plane_->receive_to_host(u.slot, inside ? p.momentum.data() + u.offset : nullptr, u.count,
                              sizeof(float));
      if (u.last) {
        p.momentum_ready = true;
        p.momentum_step = u.step;
      }
    } else {
      if (u.step != p.receiving_step) {
        p.receiving_step = u.step;
        p.received = 0;
        p.receiving_applied = true;
        if (!p.receiving) {
          if (!p.spare.empty()) {
            p.receiving = std::move(p.spare.back());
            p.spare.pop_back();
          } else {
            p.receiving = plane_->make_hold(static_cast<size_t>(p.want.elements()) * p.elem_bytes);
          }
        }
        // A recycled hold may still be read by a consumer's stream.
        p.receiving->begin_fill(plane_->reader_stream());
      }
      // Where the chunk lands among the want elements (a packed position may span ranges).
      const auto at = p.want.chunk_position(u.offset, u.count, p.packed);
      const bool in_want = at.has_value();
      const int64_t pos = at.value_or(0);
      receive_chunk(p, u, in_want, pos);
      if (in_want) p.received += u.count;
      p.receiving_applied = p.receiving_applied && u.applied;
      if (u.last && p.received == p.want.elements()) {
        // Hand the step over and start the next one in a recycled (warm) buffer.
        auto& done = p.complete[u.step];
        done.applied = p.receiving_applied;
        p.receiving->end_fill(plane_->reader_stream());
        done.values = std::move(p.receiving);  // the next step takes a spare or a new one
        p.receiving_step = -1;
        while (p.complete.size() > kMaxHeldUpdates) {
          auto& oldest = p.complete.begin()->second;
          p.dropped_through = std::max(p.dropped_through, p.complete.begin()->first);
          p.spare.push_back(std::move(oldest.values));
          p.complete.erase(p.complete.begin());
        }
        complete = true;
        cb = callback_;
      }
    }
  }
  // cuda_ipc: the copy out of the slot is only enqueued; the slot's free event orders the
  // server's next write into it, so the credit goes back at once. nccl: the receive is posted
  // (the slot is the server's own memory, its send stream orders the reuse).
  send_frame(MessageType::update_ack, transport::encode(transport::SlotAck{u.slot}));
  {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  }
  if (complete && cb) cb(u.name, u.step);
}

void Connection::receive_chunk(ParamRx& p, const transport::Update& u, bool in_want, int64_t pos) {
  const size_t at = static_cast<size_t>(pos) * p.elem_bytes;
  plane_->receive(u.slot, in_want ? static_cast<std::byte*>(p.receiving->data()) + at : nullptr,
                  u.count, p.elem_bytes);
}

}  // namespace muon::client
