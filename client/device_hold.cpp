#include "client/device_hold.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "client/device_wait.hpp"
#include "core/cuda_check.hpp"

namespace muon::client {

struct DeviceHold::Impl {
  explicit Impl(size_t n) : bytes(n) {
    try {
      if (n > 0) MUON_CUDA_CHECK(cudaMalloc(&data, n));
      MUON_CUDA_CHECK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
      MUON_CUDA_CHECK(cudaEventCreateWithFlags(&consumed, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Impl() {
    // Copies into (reader) or out of (consumers) the buffer may still be queued, on streams that
    // may wait on a server that is gone: past the deadline the memory is leaked rather than freed
    // under a copy that may still write it (client/device_wait.hpp).
    if (!event_done_within(filled, kTeardownDeadline) ||
        !event_done_within(consumed, kTeardownDeadline)) {
      const std::string why = "a copy into or out of a device holding buffer did not finish "
                              "within 10 s; leaking its " + std::to_string(bytes) + " bytes";
      detail::report_failed_call("DeviceHold teardown", why.c_str(), __FILE__, __LINE__);
      data = nullptr;
    }
    release();
  }
  void release() noexcept {
    if (consumed) MUON_CUDA_CHECK_NOTHROW(cudaEventDestroy(consumed));
    if (filled) MUON_CUDA_CHECK_NOTHROW(cudaEventDestroy(filled));
    if (data) MUON_CUDA_CHECK_NOTHROW(cudaFree(data));
    consumed = filled = nullptr;
    data = nullptr;
  }
  size_t bytes = 0;
  void* data = nullptr;
  cudaEvent_t filled = nullptr;
  cudaEvent_t consumed = nullptr;
};

DeviceHold::DeviceHold(size_t bytes) : impl_(std::make_unique<Impl>(bytes)) {}

DeviceHold::~DeviceHold() = default;

size_t DeviceHold::bytes() const {
  return impl_->bytes;
}

void* DeviceHold::data() const {
  return impl_->data;
}

void DeviceHold::begin_fill(StreamHandle stream) {
  // Never recorded (a new buffer): the wait returns at once.
  MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, impl_->consumed, 0));
}

void DeviceHold::end_fill(StreamHandle stream) {
  MUON_CUDA_CHECK(cudaEventRecord(impl_->filled, stream));
}

void DeviceHold::copy_to_device(void* dst, StreamHandle stream) {
  MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, impl_->filled, 0));
  if (impl_->bytes > 0) {
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(dst, impl_->data, impl_->bytes, cudaMemcpyDeviceToDevice, stream));
  }
  MUON_CUDA_CHECK(cudaEventRecord(impl_->consumed, stream));
}

void DeviceHold::copy_to_host(void* dst) {
  MUON_CUDA_CHECK(cudaEventSynchronize(impl_->filled));
  if (impl_->bytes > 0) {
    MUON_CUDA_CHECK(cudaMemcpy(dst, impl_->data, impl_->bytes, cudaMemcpyDeviceToHost));
  }
}

}  // namespace muon::client
