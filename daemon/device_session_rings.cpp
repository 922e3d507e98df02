// A session's rings on the GPU data plane (device_plane.hpp): made and freed, a gradient slot
// received into the reduction, a result slot written from an update or from host bytes, and the
// slots' events polled for Session::gate_frames. The cuda_ipc and nccl planes share all of it;
// where the nccl plane differs, the transfer itself, it calls its session
// (device_nccl_sessions.cpp, nccl_session.hpp). Built only with CUDA.
#include <cuda_runtime_api.h>

#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "daemon/device_plane_impl.hpp"
#include "kernels/device_convert.hpp"

namespace muon::daemon {

void DeviceSessionRingsDeleter::operator()(DeviceSessionRings* p) const noexcept {
  if (p == nullptr) return;
  if (!p->nccl) {
    delete p;
    return;
  }
  // Off the io thread, communicators first: destroying them ends (aborts, after a dead peer)
  // the transfers still queued into the rings, which cudaFree would otherwise wait for.
  auto teardown = [p] {
    cudaSetDevice(nccl_session_device(*p->nccl));
    p->nccl.reset();
    delete p;
  };
  try {
    if (teardowns && teardowns->start(teardown)) return;
  } catch (const std::exception&) {  // no thread to be had: do it here
  }
  teardown();
}

DeviceRingsPtr DevicePlane::make_session_rings(uint32_t tx_slots, uint32_t rx_slots,
                                               uint64_t slot_bytes) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return DeviceRingsPtr(new DeviceSessionRings(tx_slots, rx_slots, slot_bytes),
                        DeviceSessionRingsDeleter{impl_->teardowns});
}

const transport::DeviceRingDescriptor& DevicePlane::tx_descriptor(const DeviceSessionRings& r) {
  return r.tx.descriptor();
}
const transport::DeviceRingDescriptor& DevicePlane::rx_descriptor(const DeviceSessionRings& r) {
  return r.rx.descriptor();
}

Contribution DevicePlane::begin_receive(DeviceSessionRings& rings, uint32_t slot, int64_t count,
                                        transport::DType dtype) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  // nccl: the client's ncclSend of this chunk, received in push order.
  if (rings.nccl) nccl_receive(*rings.nccl, rings.tx, slot, count, dtype);
  const auto stream = rings.receive.get();
  rings.tx.wait_ready(slot, stream);
  return Contribution{rings.tx.slot(slot), dtype, true, count, stream};
}

void DevicePlane::end_receive(DeviceSessionRings& rings, uint32_t slot) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  rings.tx.mark_free(slot, rings.receive.get());
}

bool DevicePlane::tx_slot_written(const DeviceSessionRings& rings, uint32_t slot) {
  if (rings.nccl) return true;
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return rings.tx.ready_reached(slot);
}

bool DevicePlane::rx_slot_read(const DeviceSessionRings& rings, uint32_t slot) {
  if (rings.nccl) return true;
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return rings.rx.free_reached(slot);
}

void DevicePlane::read_tx_slot(DeviceSessionRings& rings, uint32_t slot, void* out, size_t bytes) {
  if (bytes > rings.tx.slot_bytes()) throw InvalidArgument("read past a receive slot");
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  const auto stream = impl_->streams.host.get();  // waits for this client's write only
  rings.tx.wait_ready(slot, stream);
  MUON_CUDA_CHECK(cudaMemcpyAsync(out, rings.tx.slot(slot), bytes, cudaMemcpyDeviceToHost, stream));
  impl_->streams.host.synchronize();
}

DevicePlane::SlotSend DevicePlane::send_update(DeviceSessionRings& rings, uint32_t slot,
                                               const DeviceParamState& param, int64_t offset,
                                               int64_t count, transport::DType dtype) {
  const size_t bytes = static_cast<size_t>(count) * transport::dtype_bytes(dtype);
  if (offset < 0 || count < 0 || offset + count > param.numel || bytes > rings.rx.slot_bytes()) {
    throw InvalidArgument("update chunk [" + std::to_string(offset) + ", " +
                          std::to_string(offset + count) + ") does not fit a result slot");
  }
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  const float* src = param.update.as<float>() + offset;
  if (rings.nccl) {  // the client posts the matching ncclRecv when the update frame arrives
    nccl_stage_update(*rings.nccl, rings.rx, slot, src, count, dtype, impl_->streams.ret.get());
    return slot_send(rings, slot, bytes, dtype);
  }
  const auto stream = impl_->streams.ret.get();
  rings.rx.wait_free(slot, stream);
  if (dtype == transport::DType::f32) {
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(rings.rx.slot(slot), src, bytes, cudaMemcpyDeviceToDevice, stream));
  } else {
    narrow_to_bf16_device(src, static_cast<uint16_t*>(rings.rx.slot(slot)), count, stream);
  }
  rings.rx.mark_ready(slot, stream);
  return {};
}

DevicePlane::SlotSend DevicePlane::send_host(DeviceSessionRings& rings, uint32_t slot,
                                             const void* data, size_t bytes,
                                             transport::DType dtype) {
  if (bytes > rings.rx.slot_bytes()) throw InvalidArgument("host chunk larger than a result slot");
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  // The copy from pageable memory runs on a stream of its own and is waited for here (so
  // `data` may go): the return and send streams also wait on other clients' progress, which may
  // depend on frames this io thread has not written yet. The staging stream waits only for the
  // slot's previous reader, which the client has already been told about (it returned the
  // credit), so this wait ends.
  auto& staging = impl_->streams.staging;
  rings.rx.wait_free(slot, staging.get());
  MUON_CUDA_CHECK(
      cudaMemcpyAsync(rings.rx.slot(slot), data, bytes, cudaMemcpyHostToDevice, staging.get()));
  rings.rx.mark_ready(slot, staging.get());
  staging.synchronize();
  // nccl: then sent from the slot on the session's send stream, once the frame is out.
  return rings.nccl ? slot_send(rings, slot, bytes, dtype) : SlotSend{};
}

}  // namespace muon::daemon
