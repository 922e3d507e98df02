// What the two device planes share (daemon/planes/server_plane.hpp): a session's rings in device
// memory of the server's GPU, read and written through the GPU data plane's streams
// (daemon/device_plane.hpp). The cuda_ipc plane exports them to the client
// (cuda_ipc_plane.cpp); the nccl plane keeps them local and moves chunks with NCCL
// (nccl_plane.cpp).
#pragma once

#include <memory>

#include "daemon/device_plane.hpp"
#include "daemon/planes/server_plane.hpp"
#include "transport/shm_segment.hpp"

namespace muon::daemon {

/// A cuda_ipc session: rings exported over CUDA IPC; pushes and update_acks are handled only
/// once the client's copies are done on the GPU. `plane` must outlive the result. Throws
/// DeviceError.
std::unique_ptr<ServerPlane> make_cuda_ipc_plane(DevicePlane& plane,
                                                 const transport::SegmentLayout& layout);
/// An nccl session: local rings and two communicators the client joins after its hello_ok.
/// Throws BackendUnavailable when the build has no NCCL, DeviceError.
std::unique_ptr<ServerPlane> make_nccl_plane(DevicePlane& plane,
                                             const transport::SegmentLayout& layout);

/// The rings and the calls both device planes make the same way.
class DeviceRingPlane : public ServerPlane {
 public:
  DeviceRingPlane(DevicePlane& plane, DeviceRingsPtr rings, uint32_t rx_slots)
      : plane_(plane), rings_(std::move(rings)), rx_slots_(rx_slots) {}

  uint32_t rx_slots() const override { return rx_slots_; }
  Contribution receive(uint32_t slot, int64_t count, transport::DType dtype) override {
    return plane_.begin_receive(*rings_, slot, count, dtype);
  }
  void read_received(uint32_t slot, void* out, size_t bytes) override {
    plane_.read_tx_slot(*rings_, slot, out, bytes);
  }
  void end_receive(uint32_t slot) override { plane_.end_receive(*rings_, slot); }
  AfterFrame write_host(uint32_t slot, const std::byte* data, size_t bytes,
                        transport::DType dtype) override {
    return plane_.send_host(*rings_, slot, data, bytes, dtype);
  }
  bool writes_device_updates() const override { return true; }
  AfterFrame write_update(uint32_t slot, const DeviceParamState& param, int64_t offset,
                          int64_t count, transport::DType dtype) override {
    return plane_.send_update(*rings_, slot, param, offset, count, dtype);
  }

 protected:
  DevicePlane& plane_;
  DeviceRingsPtr rings_;  // freed with the plane (cudaFree waits for the work queued on them)
  uint32_t rx_slots_;
};

}  // namespace muon::daemon
