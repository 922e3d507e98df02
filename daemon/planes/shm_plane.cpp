// Shared memory: a pushed chunk is read in place from its tx slot (fp32 and bf16 alike; the
// contribution store widens bf16 as it adds), an update's bytes are copied into an rx slot. A tx
// slot is released in the segment's credit words (transport/shm_credits.hpp), not by a frame.
#include "daemon/planes/shm_plane.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace muon::daemon {

namespace {

class ShmPlane final : public ServerPlane {
 public:
  ShmPlane(const transport::SegmentLayout& layout, DevicePlane* device)
      : segment_(transport::ShmSegment::create(layout)),
        credits_(segment_.tx_credits()),
        device_(device),
        copy_fence_(device ? layout.tx_slots : 0, 0) {}

  transport::DataPlane kind() const override { return transport::DataPlane::shm; }
  void describe(transport::HelloOk& ok) const override { ok.shm_name = segment_.name(); }
  uint32_t rx_slots() const override { return segment_.layout().rx_slots; }

  Contribution receive(uint32_t slot, int64_t count, transport::DType dtype) override {
    return Contribution{segment_.tx_slot(slot), dtype, false, count};
  }
  void read_received(uint32_t slot, void* out, size_t bytes) override {
    std::memcpy(out, segment_.tx_slot(slot), bytes);
  }
  // Read in place: the slot is released once read, on a GPU server once the copy onto the
  // device is done (the latest copy's fence: every chunk of this push was added before this
  // call).
  void end_receive(uint32_t slot) override {
    if (device_) copy_fence_.at(slot) = device_->host_copy_fence();
  }
  bool slot_released(uint32_t slot) override {
    return !device_ || device_->host_copies_done(copy_fence_.at(slot));
  }

  bool releases_in_segment() const override { return true; }
  bool release_slot(uint32_t slot) override { return credits_.release(slot); }

  AfterFrame write_host(uint32_t slot, const std::byte* data, size_t bytes,
                        transport::DType) override {
    std::memcpy(segment_.rx_slot(slot), data, bytes);
    return {};
  }
  bool has_host_result_slots() const override { return true; }
  std::byte* host_result_slot(uint32_t slot) override { return segment_.rx_slot(slot); }

  // In case the client never mapped it; the pages go once both sides unmapped. A copy onto the
  // device may still read them (a platform where pageable copies run asynchronously): they stay
  // mapped until it is done. The io thread waits here, as it once did for every shm chunk, now
  // only at a close that comes before an ack.
  void closing() noexcept override {
    transport::ShmSegment::remove(segment_.name());
    if (!device_ || copy_fence_.empty()) return;
    try {
      device_->wait_host_copies(*std::max_element(copy_fence_.begin(), copy_fence_.end()));
    } catch (const std::exception&) {  // a failed copy reads nothing any more
    }
  }

 private:
  transport::ShmSegment segment_;
  transport::ShmCreditWords credits_;  // the tx ring's, in segment_
  DevicePlane* device_;               // null on a CPU server
  std::vector<uint64_t> copy_fence_;  // per tx slot: the copy its push_ack waits for
};

}  // namespace

std::unique_ptr<ServerPlane> make_shm_plane(const transport::SegmentLayout& layout,
                                            DevicePlane* device) {
  return std::make_unique<ShmPlane>(layout, device);
}

}  // namespace muon::daemon
