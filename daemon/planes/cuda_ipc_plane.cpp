// The cuda_ipc plane: the session's rings are exported to the client, which copies its
// gradients into tx slots and its updates out of rx slots on its own GPU streams. A push is
// handled once the client's copy into its slot is done on the GPU, an update_ack once its copy
// out is (cudaEventQuery, never a wait): no stream of this server waits on a client's event,
// which a client that dies first would never record (gpu-review F2).
#include "daemon/planes/device_ring_plane.hpp"

namespace muon::daemon {

namespace {

class CudaIpcPlane final : public DeviceRingPlane {
 public:
  using DeviceRingPlane::DeviceRingPlane;

  transport::DataPlane kind() const override { return transport::DataPlane::cuda_ipc; }
  void describe(transport::HelloOk& ok) const override {
    ok.data_plane = transport::DataPlane::cuda_ipc;
    ok.tx_ring = DevicePlane::tx_descriptor(*rings_);
    ok.rx_ring = DevicePlane::rx_descriptor(*rings_);
  }
  bool gates_frames() const override { return true; }
  bool frame_ready(const transport::Frame& f) override {
    using transport::MessageType;
    if (f.type == static_cast<uint16_t>(MessageType::push)) {
      return plane_.tx_slot_written(*rings_, transport::decode<transport::Push>(f.payload).slot);
    }
    if (f.type == static_cast<uint16_t>(MessageType::update_ack)) {
      return plane_.rx_slot_read(*rings_, transport::decode<transport::SlotAck>(f.payload).slot);
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<ServerPlane> make_cuda_ipc_plane(DevicePlane& plane,
                                                 const transport::SegmentLayout& layout) {
  auto rings = plane.make_session_rings(layout.tx_slots, layout.rx_slots, layout.slot_bytes);
  return std::make_unique<CudaIpcPlane>(plane, std::move(rings), layout.rx_slots);
}

}  // namespace muon::daemon
