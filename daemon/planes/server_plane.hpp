// A session's data plane on the server's side: where the chunks a rank pushes are read, and
// where the chunks of its updates are written. One implementation per transport, each in its
// own file: shared memory (shm_plane.cpp), device rings exported over CUDA IPC
// (cuda_ipc_plane.cpp), device rings filled and drained by NCCL (nccl_plane.cpp). The push and
// update handlers (daemon/ingress/push.cpp, daemon/egress/egress.cpp) and the Session's credits
// (daemon/session.hpp) speak only this interface; the client's twin is client/plane.hpp.
//
// Slots: a plane has the session's tx ring (client -> server, `tx_slots`) and rx ring (server
// -> client, rx_slots()); the control plane's credits say which slot a chunk is in. Every call
// is on the server's io thread and never waits for a client (gpu-review F2): a device plane's
// copies are ordered on its streams by events.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "daemon/contribution_store.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

class DeviceParamState;

/// What must follow a frame once it is written to the socket (the nccl plane: the ncclSend of
/// the result slot the frame announces). Empty: nothing.
using AfterFrame = std::function<void()>;

class ServerPlane {
 public:
  virtual ~ServerPlane() = default;

  /// The plane as the hello names it.
  virtual transport::DataPlane kind() const = 0;
  /// Fills what the client needs to reach the plane into its hello_ok: the segment's name
  /// (shm), the rings' descriptors (cuda_ipc), the communicators' ids (nccl).
  virtual void describe(transport::HelloOk& ok) const = 0;
  /// Slots of the result ring.
  virtual uint32_t rx_slots() const = 0;

  /// What start() reports: nothing when the plane is ready, else the error to send the client
  /// (the plane phrases it: its code and what failed).
  using Started = std::function<void(std::optional<transport::ErrorMsg> error)>;
  /// Starts what the plane needs before its first chunk. Returns true when it is ready now;
  /// false when it gets ready later: then `done` runs once, on a thread of the plane's, after at
  /// most `timeout` (the nccl plane joins its communicators). The session holds the client's
  /// data-plane frames meanwhile (Session::hold_data_plane).
  virtual bool start(std::chrono::milliseconds timeout, Started done) {
    (void)timeout;
    (void)done;
    return true;
  }
  /// Whether the plane must be asked before each frame is handled (frame_ready).
  virtual bool gates_frames() const { return false; }
  /// Whether `frame` may be handled now, never waiting (cuda_ipc: the client's GPU copy into a
  /// push's slot, or out of an update_ack's slot, is done). Throws InvalidArgument for a slot
  /// out of range (the handler then refuses the frame).
  virtual bool frame_ready(const transport::Frame& frame) {
    (void)frame;
    return true;
  }

  /// The chunk in tx slot `slot`: `count` elements of `dtype`, as a contribution the
  /// parameter's store reads (host memory on shm, this server's device memory on the device
  /// planes). Orders what is enqueued after it behind the client's write of the slot (cuda_ipc:
  /// its ready event; nccl: posts the matching ncclRecv first). Pair with end_receive, also when
  /// the push is then refused. Throws DeviceError.
  virtual Contribution receive(uint32_t slot, int64_t count, transport::DType dtype) = 0;
  /// Copies the first `bytes` of tx slot `slot`, after receive(), to host memory (momentum
  /// loads and replica chunks, fp32; blocking on the device planes). Throws DeviceError.
  virtual void read_received(uint32_t slot, void* out, size_t bytes) = 0;
  /// The client may rewrite tx slot `slot` once the work enqueued since receive() is done
  /// (device planes: the slot's free event is recorded). Throws DeviceError.
  virtual void end_receive(uint32_t slot) = 0;
  /// Whether the reads of tx slot `slot` that end_receive() closed are done, so that its
  /// push_ack may go (never waits; Session::ack_push polls it). True but for a shm session on a
  /// GPU server while its chunk's copy onto the device runs. Throws DeviceError.
  virtual bool slot_released(uint32_t slot) {
    (void)slot;
    return true;
  }
  /// Whether tx slots are released in the session's segment (shm, transport/shm_credits.hpp):
  /// the session then calls release_slot() once slot_released() says yes, and sends a push_ack
  /// (naming transport::kWakeSlot) only when that returns true. Elsewhere each slot's push_ack
  /// frame releases it.
  virtual bool releases_in_segment() const { return false; }
  /// Segment planes: the client may rewrite tx slot `slot` (its counter advances). Returns true
  /// when the client's pusher sleeps and waits for a wake frame.
  virtual bool release_slot(uint32_t slot) {
    (void)slot;
    return false;
  }
  /// Whether the plane's transfers are matched in order with the client's (nccl): a push refused
  /// before its receive() was posted then leaves the client's transfer to match the next one,
  /// so the session must end.
  virtual bool matches_transfers_in_order() const { return false; }

  /// Writes `bytes` of host data (elements of `dtype`) into rx slot `slot`, before it returns;
  /// returns what must follow the update frame that announces the slot. Throws DeviceError.
  virtual AfterFrame write_host(uint32_t slot, const std::byte* data, size_t bytes,
                                transport::DType dtype) = 0;
  /// Whether the rx slots are host memory of this process that the io thread may write itself
  /// (shm: the segment's slots), so that an update's chunk is narrowed straight into its slot
  /// instead of into a staging buffer that write_host then copies. The device planes: no.
  virtual bool has_host_result_slots() const { return false; }
  /// Rx slot `slot`'s slot_bytes, where has_host_result_slots(); nothing follows the frame that
  /// announces what was written there. Throws InvalidArgument elsewhere.
  virtual std::byte* host_result_slot(uint32_t slot);
  /// Whether write_update can take a parameter held on the GPU data plane straight into a slot.
  virtual bool writes_device_updates() const { return false; }
  /// Writes update[offset, offset + count) of `param` (device memory) into rx slot `slot` as
  /// `dtype` (bf16: narrowed as transport::f32_to_bf16), without waiting; returns what follows
  /// the frame. Only where writes_device_updates(); throws InvalidArgument elsewhere and for a
  /// chunk that does not fit, DeviceError.
  virtual AfterFrame write_update(uint32_t slot, const DeviceParamState& param, int64_t offset,
                                  int64_t count, transport::DType dtype);

  /// The session ends: the plane lets go of what a client that never attached would leave
  /// behind (shm: the segment's name is unlinked) and waits for its own reads still running
  /// (shm on a GPU server: copies onto the device). Never throws.
  virtual void closing() noexcept {}
};

}  // namespace muon::daemon
