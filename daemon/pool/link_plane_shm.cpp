// A PeerLink's shm plane: the session's shared-memory segment, mapped from the name hello_ok gave
// (and unlinked). The slots' reuse is ordered by the credits alone (a tx slot comes back when the
// peer advances its counter in the segment, an rx slot with this side's update_ack after its
// copy), so every copy is a memcpy.
#include <cstring>
#include <utility>

#include "daemon/pool/link_plane.hpp"
#include "transport/shm_segment.hpp"

namespace muon::daemon {

namespace {

class ShmLinkPlane final : public LinkPlane {
 public:
  explicit ShmLinkPlane(transport::ShmSegment segment) : segment_(std::move(segment)) {}

  bool sends_after_frame() const override { return false; }
  std::optional<transport::ShmCreditWords> tx_credit_words() const override {
    return segment_.tx_credits();
  }
  void fill_slot(uint32_t slot, const std::byte* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(segment_.tx_slot(slot), src, bytes);
  }
  void send(const std::byte*, size_t, transport::DType, TransferDone done) override {
    done("");  // the bytes went with fill_slot
  }
  void receive(uint32_t slot, std::byte* dst, size_t bytes, transport::DType,
               TransferDone done) override {
    if (dst && bytes > 0) std::memcpy(dst, segment_.rx_slot(slot), bytes);
    done("");
  }
  void abort() noexcept override {}

 private:
  transport::ShmSegment segment_;
};

}  // namespace

std::unique_ptr<LinkPlane> make_shm_link_plane(const transport::HelloOk& ok) {
  return std::make_unique<ShmLinkPlane>(transport::ShmSegment::open_and_unlink(
      ok.shm_name, transport::SegmentLayout{ok.tx_slots, ok.rx_slots, ok.slot_bytes}));
}

}  // namespace muon::daemon
