// The nccl plane: the session's rings stay in this process; each chunk moves by an ncclRecv
// (push) or ncclSend (update) on one of two 2-rank communicators the client joins after its
// hello_ok. Transfers are matched in order with the client's, so a push refused before its
// receive was posted ends the session (push.cpp), and a result slot's send is posted only once
// the frame announcing it is written (the AfterFrame of write_*; gpu-review F1).
#include "daemon/planes/device_ring_plane.hpp"

#include <tuple>

namespace muon::daemon {

namespace {

class NcclPlane final : public DeviceRingPlane {
 public:
  using DeviceRingPlane::DeviceRingPlane;

  transport::DataPlane kind() const override { return transport::DataPlane::nccl; }
  void describe(transport::HelloOk& ok) const override {
    ok.data_plane = transport::DataPlane::nccl;
    std::tie(ok.nccl_tx_id, ok.nccl_rx_id) = DevicePlane::nccl_ids(*rings_);
  }
  // The client joins both communicators once it has the ids; the join runs on a thread the
  // DevicePlane owns and joins before it goes (never detached).
  bool start(std::chrono::milliseconds timeout, Started done) override {
    plane_.join_nccl(rings_, timeout, [done = std::move(done)](const std::string& error) {
      if (error.empty()) return done(std::nullopt);
      done(transport::ErrorMsg{ErrorCode::nccl,
                               "joining the session's NCCL communicators failed: " + error, "",
                               -1, -1});
    });
    return false;
  }
  bool matches_transfers_in_order() const override { return true; }
};

}  // namespace

std::unique_ptr<ServerPlane> make_nccl_plane(DevicePlane& plane,
                                             const transport::SegmentLayout& layout) {
  auto rings = plane.make_nccl_session(layout.tx_slots, layout.rx_slots, layout.slot_bytes);
  return std::make_unique<NcclPlane>(plane, std::move(rings), layout.rx_slots);
}

}  // namespace muon::daemon
