// The data plane of one client session, as the connection uses it: how pushed chunks reach the
// server and how update chunks come back, over whichever transport the hello agreed on. One
// implementation per transport, each in its own file, compiled only where its library exists:
//   plane_shm.cpp       host shared-memory rings (transport::ShmSegment), always built;
//   plane_cuda_ipc.cpp  the server's device rings over CUDA IPC (DeviceRings), CUDA builds;
//   plane_nccl.cpp      NCCL point-to-point into the server's rings (NcclPlane), NCCL builds;
// with device_unavailable.cpp and nccl_unavailable.cpp standing in for the last two elsewhere.
// plane.cpp is the one place that picks a plane from the negotiated data plane.
//
// The control plane stays the connection's: tx credits (which slot is free), the push and update
// frames, their order, the update reassembly (client/connection.hpp). A plane moves bytes only;
// the shm plane also hands the connection the credit words of its segment.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "client/update_hold.hpp"
#include "kernels/device_stream.hpp"
#include "transport/cuda_ipc_handle.hpp"
#include "transport/messages.hpp"
#include "transport/nccl_id.hpp"
#include "transport/shm_segment.hpp"

namespace muon::client {

/// How a plane moves the chunks of one push, called by the connection once per chunk in order:
/// `into_slot(slot, first, count)` before the chunk's push frame goes out (the bytes of elements
/// [first, first + count) of the push into tx slot `slot`; shm, cuda_ipc), `after_frame(first,
/// count)` right after it (the bytes travel out of band, after the frame that announces them:
/// nccl). Either may be empty.
struct ChunkMoves {
  std::function<void(uint32_t slot, int64_t first, int64_t count)> into_slot;
  std::function<void(int64_t first, int64_t count)> after_frame;
};
/// The connection's chunking of one push (credits, frames): takes the plane's moves, returns the
/// push frames sent. A move that throws propagates (see Connection::push_chunks).
using SendChunks = std::function<int64_t(const ChunkMoves& moves)>;

class ClientPlane {
 public:
  virtual ~ClientPlane() = default;

  /// True on a device plane (cuda_ipc, nccl): device pushes and device waits work, and update
  /// holds are device memory.
  virtual bool on_device() const = 0;
  /// The CUDA device of a device plane (its rings or communicators). Device planes only.
  virtual int device() const = 0;
  /// The stream pushes from device memory run on (device planes); nullptr on shm.
  virtual StreamHandle push_stream() const = 0;
  /// The stream the reader fills update holds on (device planes); nullptr on shm.
  virtual StreamHandle reader_stream() const = 0;
  /// True when the plane maps memory the server exports (cuda_ipc): the connection destroys it,
  /// and every hold first, before the goodbye that lets the server free that memory.
  virtual bool maps_server_memory() const = 0;
  /// The tx ring's credit words when they live in the session's segment (shm: the server
  /// releases slots there and a push_ack only wakes a sleeping pusher; transport/shm_credits.hpp);
  /// nullopt where every push_ack names the slot it releases (the device planes).
  virtual std::optional<transport::ShmCreditWords> tx_credit_words() const { return std::nullopt; }

  // ---- pushes (the caller's threads) ---------------------------------------------------------
  /// Pushes `elem_bytes`-sized elements from host memory at `data` through `send` (the
  /// connection's chunking). Returns once the bytes are out of `data` (the caller may reuse it):
  /// shm copies into the slots, cuda_ipc waits for its host copies, nccl for its sends. Returns
  /// what `send` returns. Throws what the copies throw (DeviceError on device planes).
  virtual int64_t push_host(const std::byte* data, size_t elem_bytes, const SendChunks& send) = 0;
  /// The same from device memory of device() at `device_data`, after the work queued on
  /// `stream` so far, which never waits for the server; returns once enqueued (push_stream()
  /// orders the reuse). The connection has made device() current and checked `stream` against
  /// it. Device planes only: shm throws InvalidArgument.
  virtual int64_t push_device(const std::byte* device_data, size_t elem_bytes, StreamHandle stream,
                              const SendChunks& send) = 0;

  // ---- receives (the connection's reader thread only, in frame order) ------------------------
  /// Makes the plane's device current on the reader thread (before any receive or hold); no-op
  /// on shm.
  virtual void enter_reader_thread() = 0;
  /// A hold of `bytes` in this plane's memory for one parameter's updates. Throws DeviceError.
  virtual std::unique_ptr<UpdateHold> make_hold(size_t bytes) = 0;
  /// Copies rx slot `slot`'s update chunk of `count` elements of `elem_bytes` (2: bf16, else
  /// fp32) to `dst`, an address inside a hold of this plane, or drops it when `dst` is nullptr
  /// (a chunk this client does not keep: the slot is released, a sent one received and
  /// discarded). Device planes return once enqueued on reader_stream(). Throws DeviceError.
  virtual void receive(uint32_t slot, void* dst, int64_t count, size_t elem_bytes) = 0;
  /// The same into host memory, complete on return (fetched momentum, fp32). Throws DeviceError.
  virtual void receive_to_host(uint32_t slot, void* dst, int64_t count, size_t elem_bytes) = 0;

  // ---- teardown ------------------------------------------------------------------------------
  /// The server is gone: transfers queued for it end now (nccl aborts its communicators; other
  /// planes have none that could wait on it). Any thread; idempotent.
  virtual void abort() noexcept = 0;
  /// After the reader has stopped, before the holds go: waits for the plane's own transfers to
  /// end, aborting them first when `server_gone` (nccl; a no-op elsewhere). Never throws.
  virtual void finish(bool server_gone) noexcept = 0;
};

/// Throws BackendUnavailable naming `endpoint` when this client was built without what data
/// plane `kind` needs (nccl: NCCL), before anything connects; cuda_ipc without CUDA says so when
/// its plane is made.
void require_plane_built(transport::DataPlane kind, const std::string& endpoint);

/// The plane of the data plane `ok` agreed to (ok.data_plane), set up from what the hello sent:
/// shm maps and unlinks ok.shm_name; cuda_ipc opens ok.tx_ring / ok.rx_ring on the current CUDA
/// device; nccl joins ok.nccl_tx_id then ok.nccl_rx_id as rank 1 on the current CUDA device,
/// waiting up to `op_timeout` for each. Throws ServerError (bad_reply, naming `endpoint`) when
/// the hello lacks what its data plane needs, BackendUnavailable (built without CUDA or NCCL),
/// DeviceError (no usable GPU, CUDA or NCCL refuses), muon::Error (the segment cannot be mapped).
std::unique_ptr<ClientPlane> make_client_plane(const transport::HelloOk& ok,
                                               const std::string& endpoint,
                                               std::chrono::milliseconds op_timeout);

// The transports' own makers, each in its plane's file (or its unavailable twin); called by
// make_client_plane, and by tests that set a plane up without a server.

/// Host shared-memory rings: maps segment `name` of `layout` (the server created it) and unlinks
/// the name. Throws muon::Error on any OS failure.
std::unique_ptr<ClientPlane> make_shm_plane(const std::string& name,
                                            const transport::SegmentLayout& layout);
/// The server's device rings over CUDA IPC (DeviceRings). Throws BackendUnavailable (built
/// without CUDA), DeviceError, InvalidArgument (an inconsistent descriptor).
std::unique_ptr<ClientPlane> make_cuda_ipc_plane(const transport::DeviceRingDescriptor& tx,
                                                 const transport::DeviceRingDescriptor& rx);
/// True when this client was built with NCCL.
bool nccl_plane_built();
/// The session's NCCL communicators (NcclPlane). Throws BackendUnavailable (built without NCCL),
/// DeviceError.
std::unique_ptr<ClientPlane> make_nccl_plane(const transport::NcclIdBytes& tx_id,
                                             const transport::NcclIdBytes& rx_id,
                                             uint64_t slot_bytes,
                                             std::chrono::milliseconds timeout);

}  // namespace muon::client
