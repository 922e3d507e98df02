#include "client/device_scope.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"

namespace muon::client {

DeviceScope::DeviceScope(int device) : device_(device) {
  MUON_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) MUON_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceScope::~DeviceScope() {
  if (previous_ != device_) MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
}

void require_stream_on_device(StreamHandle stream, int device, int caller_device,
                              const std::string& what) {
  int owner = caller_device;
  const bool default_stream =
      stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
#if CUDART_VERSION >= 12080
  if (!default_stream) MUON_CUDA_CHECK(cudaStreamGetDevice(stream, &owner));
#else
  if (!default_stream) return;
#endif
  if (owner != device) {
    throw InvalidArgument(what + ": the stream belongs to CUDA device " + std::to_string(owner) +
                          " but the connection's data plane lives on device " +
                          std::to_string(device) +
                          " (push from the device the client was created on)");
  }
}

}  // namespace muon::client
