// The client end of an nccl session (transport/messages.hpp, DataPlane::nccl): the session's two
// NCCL communicators of 2 ranks (server rank 0, this end rank 1; transport/nccl_comm.hpp), joined
// from the ids of hello_ok, with this end's own streams and staging buffers. Gradients go out
// with ncclSend on the tx communicator after their push frame; updates come back with ncclRecv on
// the rx communicator, posted when their update frame arrives (the server posts the matching
// calls in frame order). Used by the trainer's client (client/plane_nccl.cpp) and by a server
// reaching a peer server of its pool (daemon/pool/link_plane_nccl.cpp). Plain C++ header (no CUDA
// or NCCL types); the implementation is nccl_client_comms.cpp, compiled in builds with NCCL only.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "kernels/device_stream.hpp"
#include "transport/messages.hpp"
#include "transport/nccl_id.hpp"

namespace muon::transport {

class NcclClientComms {
 public:
  /// Joins the tx communicator, then the rx one, as rank 1 of 2 on the current CUDA device,
  /// waiting up to `timeout` for each (the server joins both on a thread of its own); allocates
  /// two staging buffers of `slot_bytes` (device memory). Throws BackendUnavailable (built
  /// without NCCL), DeviceError (no usable GPU, NCCL refuses or times out; e.g. NCCL refuses two
  /// ranks of one communicator on the same GPU).
  NcclClientComms(const transport::NcclIdBytes& tx_id, const transport::NcclIdBytes& rx_id,
            uint64_t slot_bytes, std::chrono::milliseconds timeout);
  /// Aborts both communicators (the server is gone): transfers queued on any stream return and
  /// the plane is unusable. Any thread; idempotent.
  void abort() noexcept;
  /// Waits for the plane's streams (synchronize(): at most kDrainTimeout, then aborts), then
  /// finalizes both communicators (NcclComm's destructor).
  ~NcclClientComms();
  NcclClientComms(const NcclClientComms&) = delete;
  NcclClientComms& operator=(const NcclClientComms&) = delete;

  /// The CUDA device the communicators live on.
  int device() const;

  // ---- tx communicator (pushing threads, one at a time: the caller serializes) -------------
  /// Enqueues an ncclSend to the server of `count` elements of `dtype` at `device_src` (device
  /// memory of the plane's device) on the plane's push stream, after the work queued on
  /// `stream` so far (an event): `stream` never holds the NCCL kernel, which completes only when
  /// the server's receive does (gpu-review F10). Returns once NCCL has enqueued it; the source
  /// must stay alive and unchanged until the push stream has passed the send (push_stream()).
  /// Throws DeviceError (NCCL: the communicator is then aborted).
  void send(const void* device_src, size_t count, transport::DType dtype, StreamHandle stream);
  /// The stream every send runs on.
  StreamHandle push_stream() const;
  /// The same from host memory: copies into the tx staging buffer on the plane's push stream,
  /// sends from there, and waits for the stream (the caller may reuse `host_src` on return).
  /// Throws InvalidArgument (more than slot_bytes), DeviceError.
  void send_host(const void* host_src, size_t count, transport::DType dtype);

  // ---- rx communicator (the connection's reader thread only) -------------------------------
  /// Makes the plane's device current on the calling thread.
  void enter_reader_thread();
  /// The reader's stream (non-blocking): receives into holding buffers run there.
  StreamHandle reader_stream() const;
  /// Enqueues on the reader stream an ncclRecv from the server of `count` elements of `dtype`
  /// into `device_dst`. Returns once enqueued. Throws DeviceError.
  void recv(void* device_dst, size_t count, transport::DType dtype);
  /// The same into host memory through the rx staging buffer; returns once the values are in
  /// `host_dst`. Throws InvalidArgument (more than slot_bytes), DeviceError.
  void recv_to_host(void* host_dst, size_t count, transport::DType dtype);
  /// Receives a chunk this client does not keep (into the rx staging buffer): the server sent
  /// it, so a matching ncclRecv must be posted. Throws as recv_to_host.
  void discard(size_t count, transport::DType dtype);

  /// Blocks until the reader's and the push stream's work is done, at most `timeout` for each
  /// (a server that is gone never posts its side of the transfers): past it, aborts both
  /// communicators, whose transfers then return, and waits for the streams' other work. Never
  /// throws (reports). The destructor calls it with kDrainTimeout.
  void synchronize(std::chrono::milliseconds timeout = kDrainTimeout) noexcept;
  static constexpr std::chrono::milliseconds kDrainTimeout{10000};

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon::transport
