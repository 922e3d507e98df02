// Push and commit frames: a chunk's slot checked and read through the session's data plane
// (daemon/planes/server_plane.hpp), its step checked, and its values added to the step's reducer.
#include "daemon/engine.hpp"


#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using transport::Frame;
using transport::MessageType;

namespace {

// A gradient chunk into the step's reducer: at a packed position of the rank's push ranges under
// a packed registration (a column block's rows in one chunk), else at its element offset.
void add_chunk(StepReducer& reducer, const ParameterLayout& layout, int rank, int64_t offset,
               const Contribution& values) {
  const auto& ranks = layout.ranks;
  if (rank >= 0 && rank < static_cast<int>(ranks.size()) && ranks[rank].packed) {
    reducer.add_packed(rank, offset, values);
  } else {
    reducer.add(rank, offset, values);
  }
}

// The fp32 values of tx slot `slot` (momentum loads, replica chunks), copied into `scratch`.
std::span<const float> read_f32(ServerPlane& plane, uint32_t slot, int64_t count,
                                std::vector<float>& scratch) {
  const auto n = static_cast<size_t>(count);
  if (scratch.size() < n) scratch.resize(n);
  plane.read_received(slot, scratch.data(), n * sizeof(float));
  return {scratch.data(), n};
}

}  // namespace

void Engine::on_push(const SessionPtr& s, const Frame& f) {
  ServerPlane& plane = *s->plane();  // set at the hello, which every push follows (dispatch.cpp)
  // On a plane whose transfers are matched in order (nccl) the client queued the chunk's
  // transfer together with the frame: a push refused before plane.receive() was posted would
  // leave that transfer to match the next receive and shift every later chunk. Such a session
  // ends (after the reply that says why).
  bool received = false;
  struct CloseIfUnmatched {
    asio::io_context& io;
    const SessionPtr& s;
    const bool& received;
    ~CloseIfUnmatched() {
      if (received || s->closed() || !s->plane() || !s->plane()->matches_transfers_in_order()) {
        return;
      }
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
  // The slot is free again however this push ends: credits are never lost. On a device plane
  // its free event is recorded after the reads enqueued.
  struct AckOnExit {
    const SessionPtr& s;
    ServerPlane& plane;
    uint32_t slot;
    ~AckOnExit() {
      try {
        plane.end_receive(slot);
      } catch (const std::exception& e) {
        log()->error("session {}: freeing receive slot {}: {}", s->id(), slot, e.what());
      }
      s->ack_push(slot);  // once the plane's reads of the slot are done
    }
  } ack{s, plane, m.slot};
  try {
    // A chunk names its parameter by the session's id (its name only on a replica session); an
    // id the session never handed out is a bad_request, its slot acked all the same.
    if (m.param_id != transport::kNoParamId) m.name = s->param_name(m.param_id);
    if (m.kind == transport::ChunkKind::replica_momentum ||
        m.kind == transport::ChunkKind::replica_update) {  // an owner's state, to its buddy (fp32)
      const size_t bytes = static_cast<size_t>(m.count) * 4;
      if (bytes > config_.layout.slot_bytes) {
        throw InvalidArgument("replica chunk of " + std::to_string(m.count) + " elements of '" +
                              m.name + "' is larger than a slot");
      }
      plane.receive(m.slot, m.count, DType::f32);
      received = true;
      on_replica_push(s, m, read_f32(plane, m.slot, m.count, scratch_));
      return;
    }
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
    // The chunk where it lies (a shared-memory slot, or a device slot of this server): the
    // reducer reads it straight from there, widening bf16 as it adds.
    const Contribution chunk = plane.receive(m.slot, m.count, dt);
    received = true;
    if (m.kind == transport::ChunkKind::momentum) {
      load_momentum(m, p, read_f32(plane, m.slot, m.count, scratch_));
      metrics_.chunk_received(m.kind, bytes);
      return;
    }
    if (replaying(p, m.step)) return;  // answered from the replica at its commit
    check_gradient_step(m, p);
    StepReducer* reducer = start_gathering(s, m, p);
    if (!reducer) return;  // refused (a lost rank): the error went out
    reducer->begin_attempt(s->rank, m.attempt);
    add_chunk(*reducer, *p.layout, s->rank, m.offset, chunk);
    metrics_.chunk_received(m.kind, bytes);
  } catch (const StepMismatch& e) {  // already applied, or a gap: the client may tell them apart
    reply_error(s, {ErrorCode::step_mismatch, e.message(), m.name, m.step, s->rank}, f.request_id);
  } catch (const InvalidArgument& e) {
    reply_error(s, {ErrorCode::bad_request, e.message(), m.name, m.step, s->rank}, f.request_id);
  }
}

void Engine::on_commit(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::Commit>(f.payload);
  try {
    Param& p = registered_param(m.name, s);
    // A rank that pushes nothing for this parameter (an empty shard) has nothing to commit: its
    // commit is harmless, whether or not the others have pushed (client/muon_client.h).
    if (!contributes(*p.layout, s->rank)) return;
    if (replaying(p, m.step)) {  // pushed again after its owner was lost: the owner's answer
      send_replay(m.name, p, s);
      return;
    }
    StepReducer* reducer = p.steps.gathering();
    if (!reducer || reducer->step() != m.step) {
      throw InvalidArgument("parameter '" + m.name + "': commit of step " + std::to_string(m.step) +
                            " that has no data from rank " + std::to_string(s->rank));
    }
    reducer->begin_attempt(s->rank, m.attempt);
    reducer->commit(s->rank);
    if (reducer->complete()) start_compute(m.name, p);
  } catch (const InvalidArgument& e) {
    reply_error(s, {ErrorCode::bad_request, e.message(), m.name, m.step, s->rank}, f.request_id);
  }
}

}  // namespace muon::daemon
