// The cuda_ipc data plane: the server's device rings opened over CUDA IPC (DeviceRings), updates
// held in device memory of the rings' device (DeviceHold). Compiled in CUDA builds only;
// device_unavailable.cpp has the maker of a build without CUDA.
#include <memory>

#include "client/device_hold.hpp"
#include "client/device_rings.hpp"
#include "client/plane.hpp"

namespace muon::client {

namespace {

class CudaIpcPlane final : public ClientPlane {
 public:
  CudaIpcPlane(const transport::DeviceRingDescriptor& tx, const transport::DeviceRingDescriptor& rx)
      : rings_(tx, rx) {}

  bool on_device() const override { return true; }
  int device() const override { return rings_.device(); }
  StreamHandle push_stream() const override { return rings_.push_stream(); }
  StreamHandle reader_stream() const override { return rings_.reader_stream(); }
  bool maps_server_memory() const override { return true; }

  int64_t push_host(const std::byte* data, size_t elem_bytes, const SendChunks& send) override {
    const int64_t frames = send({[&](uint32_t slot, int64_t first, int64_t n) {
                                   rings_.copy_in_host(slot, data + first * elem_bytes,
                                                       static_cast<size_t>(n) * elem_bytes);
                                 },
                                 {}});
    rings_.sync_host_pushes();  // the caller may reuse `data` once this returns
    return frames;
  }
  int64_t push_device(const std::byte* device_data, size_t elem_bytes, StreamHandle stream,
                      const SendChunks& send) override {
    return send({[&](uint32_t slot, int64_t first, int64_t n) {
                   rings_.copy_in(slot, device_data + first * elem_bytes,
                                  static_cast<size_t>(n) * elem_bytes, stream);
                 },
                 {}});
  }

  void enter_reader_thread() override { rings_.enter_reader_thread(); }
  std::unique_ptr<UpdateHold> make_hold(size_t bytes) override {
    return std::make_unique<DeviceHold>(bytes);
  }
  void receive(uint32_t slot, void* dst, int64_t count, size_t elem_bytes) override {
    if (dst) {
      rings_.copy_out(slot, dst, static_cast<size_t>(count) * elem_bytes);
    } else {
      rings_.release(slot);
    }
  }
  void receive_to_host(uint32_t slot, void* dst, int64_t count, size_t elem_bytes) override {
    if (dst) {
      rings_.copy_out_to_host(slot, dst, static_cast<size_t>(count) * elem_bytes);
    } else {
      rings_.release(slot);
    }
  }

  // The slots' events order every copy; nothing waits on the server but the GPU work itself,
  // which DeviceRings' destructor waits for.
  void abort() noexcept override {}
  void finish(bool) noexcept override {}

 private:
  DeviceRings rings_;  // its destructor waits for its streams and copies, unmaps the rings
};

}  // namespace

std::unique_ptr<ClientPlane> make_cuda_ipc_plane(const transport::DeviceRingDescriptor& tx,
                                                 const transport::DeviceRingDescriptor& rx) {
  return std::make_unique<CudaIpcPlane>(tx, rx);
}

}  // namespace muon::client
