// The GPU data plane's nccl sessions (device_plane.hpp): rings plus a session's communicators
// (nccl_session.hpp, whose nccl_session_none.cpp twin refuses to open one in a build without
// NCCL), their join on a thread the plane owns, and the send of a result slot once its frame is
// written. Built only with CUDA.
#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "daemon/device_plane_impl.hpp"

namespace muon::daemon {

DeviceRingsPtr DevicePlane::make_nccl_session(uint32_t tx_slots, uint32_t rx_slots,
                                              uint64_t slot_bytes) {
  auto nccl = open_nccl_session(config_.device);  // BackendUnavailable without NCCL
  auto rings = make_session_rings(tx_slots, rx_slots, slot_bytes);
  rings->nccl = std::move(nccl);
  return rings;
}

std::pair<transport::NcclIdBytes, transport::NcclIdBytes> DevicePlane::nccl_ids(
    const DeviceSessionRings& rings) {
  if (!rings.nccl) throw InvalidArgument("not an nccl session");
  return nccl_session_ids(*rings.nccl);
}

void DevicePlane::join_nccl(const DeviceRingsPtr& rings, std::chrono::milliseconds timeout,
                            std::function<void(const std::string& error)> done) {
  if (!rings || !rings->nccl) throw InvalidArgument("not an nccl session");
  // The thread holds the NCCL state, not the rings: a session closed meanwhile frees its rings;
  // the communicators go when the thread is done with them.
  const bool started = impl_->joiners.start([n = rings->nccl, timeout, done = std::move(done)] {
    try {
      join_nccl_session(*n, timeout);
      done("");
    } catch (const std::exception& e) {
      done(e.what());
    }
  });
  if (!started) throw InvalidArgument("the GPU data plane is shutting down");
}

DevicePlane::SlotSend DevicePlane::slot_send(DeviceSessionRings& rings, uint32_t slot, size_t bytes,
                                             transport::DType dtype) {
  // Holds the session's NCCL state, not the rings' owner: a session closed before its frame
  // was written drops this unrun (Session::finish).
  return [device = config_.device, n = rings.nccl, &rx = rings.rx, slot, bytes, dtype] {
    MUON_CUDA_CHECK(cudaSetDevice(device));
    nccl_send_slot(*n, rx, slot, bytes, dtype);
  };
}

}  // namespace muon::daemon
