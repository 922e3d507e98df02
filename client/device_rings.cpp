#include "client/device_rings.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#include "transport/cuda_ipc.hpp"

namespace muon::client {

namespace {

// One cache per process: each server allocation is mapped once, whatever the connections. Never
// destroyed: a connection may outlive static destruction (a Python client collected at exit), and
// the process' exit unmaps everything anyway.
transport::IpcHandleCache& ipc_cache() {
  static transport::IpcHandleCache* const cache = transport::make_cuda_ipc_cache().release();
  return *cache;
}

}  // namespace

struct DeviceRings::Impl {
  Impl(const transport::DeviceRingDescriptor& tx_ring,
       const transport::DeviceRingDescriptor& rx_ring)
      : device(current_device()), tx(tx_ring, ipc_cache()), rx(rx_ring, ipc_cache()) {}
  static int current_device() {
    int d = 0;
    MUON_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  int device;
  transport::RemoteRing tx, rx;
  DeviceStream host_push_stream;
  DeviceStream reader_stream;
};

DeviceRings::DeviceRings(const transport::DeviceRingDescriptor& tx,
                         const transport::DeviceRingDescriptor& rx)
    : impl_(std::make_unique<Impl>(tx, rx)) {}

DeviceRings::~DeviceRings() = default;

uint64_t DeviceRings::slot_bytes() const {
  return impl_->tx.slot_bytes();
}

void DeviceRings::copy_in(uint32_t slot, const void* src, size_t bytes, StreamHandle stream) {
  impl_->tx.copy_in(slot, src, bytes, stream);
}

void DeviceRings::copy_in_host(uint32_t slot, const void* src, size_t bytes) {
  impl_->tx.copy_in(slot, src, bytes, impl_->host_push_stream.get());
}

void DeviceRings::sync_host_pushes() {
  impl_->host_push_stream.synchronize();
}

void DeviceRings::enter_reader_thread() {
  MUON_CUDA_CHECK(cudaSetDevice(impl_->device));
}

StreamHandle DeviceRings::reader_stream() const {
  return impl_->reader_stream.get();
}

void DeviceRings::copy_out(uint32_t slot, void* dst, size_t bytes) {
  impl_->rx.copy_out(slot, dst, bytes, impl_->reader_stream.get());
}

void DeviceRings::copy_out_to_host(uint32_t slot, void* dst, size_t bytes) {
  impl_->rx.copy_out(slot, dst, bytes, impl_->reader_stream.get());
  impl_->reader_stream.synchronize();
}

void DeviceRings::release(uint32_t slot) {
  impl_->rx.mark_free(slot, impl_->reader_stream.get());
}

}  // namespace muon::client
