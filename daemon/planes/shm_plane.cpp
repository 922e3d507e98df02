// Shared memory: a pushed chunk is read in place from its tx slot (fp32 and bf16 alike; the
// contribution store widens bf16 as it adds), an update's bytes are copied into an rx slot.
#include "daemon/planes/shm_plane.hpp"

#include <cstring>

namespace muon::daemon {

namespace {

class ShmPlane final : public ServerPlane {
 public:
  explicit ShmPlane(const transport::SegmentLayout& layout)
      : segment_(transport::ShmSegment::create(layout)) {}

  transport::DataPlane kind() const override { return transport::DataPlane::shm; }
  void describe(transport::HelloOk& ok) const override { ok.shm_name = segment_.name(); }
  uint32_t rx_slots() const override { return segment_.layout().rx_slots; }

  Contribution receive(uint32_t slot, int64_t count, transport::DType dtype) override {
    return Contribution{segment_.tx_slot(slot), dtype, false, count};
  }
  void read_received(uint32_t slot, void* out, size_t bytes) override {
    std::memcpy(out, segment_.tx_slot(slot), bytes);
  }
  void end_receive(uint32_t) override {}  // read in place: the push_ack frees it

  AfterFrame write_host(uint32_t slot, const std::byte* data, size_t bytes,
                        transport::DType) override {
    std::memcpy(segment_.rx_slot(slot), data, bytes);
    return {};
  }

  // In case the client never mapped it; the pages go once both sides unmapped.
  void closing() noexcept override { transport::ShmSegment::remove(segment_.name()); }

 private:
  transport::ShmSegment segment_;
};

}  // namespace

std::unique_ptr<ServerPlane> make_shm_plane(const transport::SegmentLayout& layout) {
  return std::make_unique<ShmPlane>(layout);
}

}  // namespace muon::daemon
