// The shm data plane: the session's shared-memory segment (transport/shm_segment.hpp), a tx ring
// the client copies pushes into and an rx ring the server writes updates into, with updates held
// in host memory. The slots' reuse is ordered by the credits alone (a tx slot comes back when the
// server advances its counter in the segment, an rx slot with the update_ack after the copy),
// so every copy here is a plain memcpy.
#include <cstring>
#include <utility>
#include <vector>

#include "client/plane.hpp"
#include "core/error.hpp"

namespace muon::client {

namespace {

/// An update hold in host memory: filled by memcpy on the reader thread, read under the
/// connection's lock, so no event orders it.
class HostHold final : public UpdateHold {
 public:
  explicit HostHold(size_t bytes) : bytes_(bytes) {}
  size_t bytes() const override { return bytes_.size(); }
  void* data() const override {
    return bytes_.empty() ? nullptr : const_cast<std::byte*>(bytes_.data());
  }
  void begin_fill(StreamHandle) override {}
  void end_fill(StreamHandle) override {}
  void copy_to_device(void*, StreamHandle) override {
    throw InvalidArgument("an update held in host memory (data plane shm) cannot be copied "
                          "to device memory");
  }
  void copy_to_host(void* dst) override {
    if (!bytes_.empty()) std::memcpy(dst, bytes_.data(), bytes_.size());
  }

 private:
  std::vector<std::byte> bytes_;
};

class ShmPlane final : public ClientPlane {
 public:
  explicit ShmPlane(transport::ShmSegment segment) : segment_(std::move(segment)) {}

  bool on_device() const override { return false; }
  int device() const override {
    throw InvalidArgument("data plane shm has no CUDA device");
  }
  StreamHandle push_stream() const override { return nullptr; }
  StreamHandle reader_stream() const override { return nullptr; }
  bool maps_server_memory() const override { return false; }
  std::optional<transport::ShmCreditWords> tx_credit_words() const override {
    return segment_.tx_credits();
  }

  int64_t push_host(const std::byte* data, size_t elem_bytes, const SendChunks& send) override {
    return send({[&](uint32_t slot, int64_t first, int64_t n) {
                   std::memcpy(segment_.tx_slot(slot), data + first * elem_bytes,
                               static_cast<size_t>(n) * elem_bytes);
                 },
                 {}});
  }
  int64_t push_device(const std::byte*, size_t, StreamHandle, const SendChunks&) override {
    throw InvalidArgument("data plane shm takes no pushes from device memory");
  }

  void enter_reader_thread() override {}
  std::unique_ptr<UpdateHold> make_hold(size_t bytes) override {
    return std::make_unique<HostHold>(bytes);
  }
  void receive(uint32_t slot, void* dst, int64_t count, size_t elem_bytes) override {
    // A chunk not kept needs nothing: its slot is free again once the update_ack goes out.
    if (dst) std::memcpy(dst, segment_.rx_slot(slot), static_cast<size_t>(count) * elem_bytes);
  }
  void receive_to_host(uint32_t slot, void* dst, int64_t count, size_t elem_bytes) override {
    receive(slot, dst, count, elem_bytes);
  }

  void abort() noexcept override {}
  void finish(bool) noexcept override {}

 private:
  transport::ShmSegment segment_;
};

}  // namespace

std::unique_ptr<ClientPlane> make_shm_plane(const std::string& name,
                                            const transport::SegmentLayout& layout) {
  return std::make_unique<ShmPlane>(transport::ShmSegment::open_and_unlink(name, layout));
}

}  // namespace muon::client
