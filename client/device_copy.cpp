#include "client/device_copy.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"

namespace muon::client {

bool built_with_cuda() {
  return true;
}

void require_device_memory(const void* ptr, const std::string& what) {
  cudaPointerAttributes a{};
  if (const cudaError_t e = cudaPointerGetAttributes(&a, ptr); e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the next call must not see it
    throw DeviceError(what + ": CUDA cannot tell where the buffer lives: " +
                      detail::failed_call("cudaPointerGetAttributes", cudaGetErrorString(e)) +
                      " (no usable GPU here?)");
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
    throw InvalidArgument(what + ": " +
                          (a.type == cudaMemoryTypeHost ? "pinned host memory"
                                                        : "memory unknown to CUDA (host memory)") +
                          " where CUDA device memory is needed (use the host entry point)");
  }
}

void copy_device_to_host(void* host_dst, const void* device_src, size_t bytes,
                         StreamHandle stream) {
  if (bytes == 0) return;
  MUON_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream));
  MUON_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_host_to_device(void* device_dst, const void* host_src, size_t bytes,
                         StreamHandle stream) {
  if (bytes == 0) return;
  MUON_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
  MUON_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace muon::client
