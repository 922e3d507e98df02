// What the GPU data plane's files share (daemon/device_plane.hpp): its streams, the device Muon
// step, its threads, and the opaque types the header names. Only for files built with CUDA.
#pragma once

#include <memory>

#include "daemon/device_plane.hpp"
#include "daemon/device_streams.hpp"
#include "daemon/host_copy_fences.hpp"
#include "daemon/nccl_session.hpp"
#include "daemon/pinned_blocks.hpp"
#include "daemon/owned_threads.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_event.hpp"
#include "kernels/device_muon.hpp"
#include "transport/cuda_ipc.hpp"

namespace muon::daemon {

/// A parameter's device buffers (numel fp32 each; momentum only when has_momentum) and the events
/// that order its step: grad_ready (the reduction, before compute), released (every copy of the
/// update out, before the next step overwrites it).
class DeviceParamState {
 public:
  int64_t numel = 0;
  bool has_momentum = false;
  DeviceBuffer grad, momentum, update;
  OwnedEvent grad_ready, released;
};

/// A session's gradient ring (tx, client -> server), result ring (rx) and receive stream: the
/// rings exported over CUDA IPC on the cuda_ipc plane, local and moved by NCCL on the nccl
/// plane; the stream reduces the session's chunks into their ranks' buffers
/// (device_streams.hpp). On the current device.
class DeviceSessionRings {
 public:
  DeviceSessionRings(uint32_t tx_slots, uint32_t rx_slots, uint64_t slot_bytes)
      : receive(StreamPriority::high), tx(tx_slots, slot_bytes), rx(rx_slots, slot_bytes) {}
  DeviceStream receive;
  transport::DeviceRing tx, rx;
  std::shared_ptr<NcclSession> nccl;  // null on the cuda_ipc plane (daemon/nccl_session.hpp)
};

struct DevicePlane::Impl {
  explicit Impl(const DevicePlaneConfig& c)
      : streams(c.priority), muon(DeviceMuonConfig{c.device, c.capture_graphs}) {}
  DeviceStreams streams;
  HostCopyFences host_copies;  // shm chunks staged on streams.shm (io thread)
  PinnedBlocks pinned;         // the io thread's copies to and from the host that never wait
  DeviceMuon muon;             // the worker thread's only

  // The NCCL joining threads (join_nccl; each within its join timeout) and the nccl sessions'
  // teardown threads (each within NCCL's finalize deadline), joined in ~DevicePlane.
  OwnedThreads joiners;
  std::shared_ptr<OwnedThreads> teardowns = std::make_shared<OwnedThreads>();
};

/// Bytes of `n` fp32 values.
inline size_t f32_bytes(int64_t n) {
  return static_cast<size_t>(n) * sizeof(float);
}

}  // namespace muon::daemon
