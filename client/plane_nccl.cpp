// The nccl data plane: the session's two NCCL communicators (transport::NcclClientComms), updates held in device
// memory of their device (DeviceHold). Pushed bytes follow their push frame with ncclSend; the
// reader posts an ncclRecv for every update chunk the server sent, kept or not, in frame order.
// Compiled in builds with NCCL only; nccl_unavailable.cpp has the maker of the others.
#include <memory>

#include "client/device_hold.hpp"
#include "client/device_scope.hpp"
#include "transport/nccl_client_comms.hpp"
#include "client/plane.hpp"

namespace muon::client {

namespace {

// The element type of data-plane bytes from their size (momentum always travels as fp32).
transport::DType dtype_of(size_t elem_bytes) {
  return elem_bytes == 2 ? transport::DType::bf16 : transport::DType::f32;
}

class NcclClientPlane final : public ClientPlane {
 public:
  NcclClientPlane(const transport::NcclIdBytes& tx_id, const transport::NcclIdBytes& rx_id,
                  uint64_t slot_bytes, std::chrono::milliseconds timeout)
      : nccl_(tx_id, rx_id, slot_bytes, timeout) {}

  bool on_device() const override { return true; }
  int device() const override { return nccl_.device(); }
  StreamHandle push_stream() const override { return nccl_.push_stream(); }
  StreamHandle reader_stream() const override { return nccl_.reader_stream(); }
  bool maps_server_memory() const override { return false; }

  int64_t push_host(const std::byte* data, size_t elem_bytes, const SendChunks& send) override {
    DeviceScope scope(nccl_.device());
    return send({{}, [&](int64_t first, int64_t n) {
                   nccl_.send_host(data + first * elem_bytes, static_cast<size_t>(n),
                                   dtype_of(elem_bytes));
                 }});
  }
  int64_t push_device(const std::byte* device_data, size_t elem_bytes, StreamHandle stream,
                      const SendChunks& send) override {
    return send({{}, [&](int64_t first, int64_t n) {
                   nccl_.send(device_data + first * elem_bytes, static_cast<size_t>(n),
                              dtype_of(elem_bytes), stream);
                 }});
  }

  void enter_reader_thread() override { nccl_.enter_reader_thread(); }
  std::unique_ptr<UpdateHold> make_hold(size_t bytes) override {
    return std::make_unique<DeviceHold>(bytes);
  }
  // Posted in frame order (the one reader thread), as the server sent them.
  void receive(uint32_t, void* dst, int64_t count, size_t elem_bytes) override {
    if (dst) {
      nccl_.recv(dst, static_cast<size_t>(count), dtype_of(elem_bytes));
    } else {
      nccl_.discard(static_cast<size_t>(count), dtype_of(elem_bytes));
    }
  }
  void receive_to_host(uint32_t, void* dst, int64_t count, size_t elem_bytes) override {
    if (dst) {
      nccl_.recv_to_host(dst, static_cast<size_t>(count), dtype_of(elem_bytes));
    } else {
      nccl_.discard(static_cast<size_t>(count), dtype_of(elem_bytes));
    }
  }

  // NCCL transfers queued for a server that is gone would spin on their streams (the trainer's
  // among them) forever.
  void abort() noexcept override { nccl_.abort(); }
  // The communicators are the client's own memory. A server that is gone never finishes the
  // transfers queued on the plane's streams: abort them, and otherwise wait for them with a
  // deadline, before the holding buffers (whose events follow those transfers) wait for theirs
  // (gpu-review F6).
  void finish(bool server_gone) noexcept override {
    if (server_gone) nccl_.abort();
    nccl_.synchronize();
  }

 private:
  transport::NcclClientComms nccl_;
};

}  // namespace

bool nccl_plane_built() {
  return true;
}

std::unique_ptr<ClientPlane> make_nccl_plane(const transport::NcclIdBytes& tx_id,
                                             const transport::NcclIdBytes& rx_id,
                                             uint64_t slot_bytes,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<NcclClientPlane>(tx_id, rx_id, slot_bytes, timeout);
}

}  // namespace muon::client
