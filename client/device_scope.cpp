#include "client/device_scope.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"

namespace muon::client {
namespace {

// The device `stream` belongs to, or -1 where the runtime cannot tell (cudaStreamGetDevice came
// with CUDA 12.8).
#if CUDART_VERSION >= 12080
int device_of(StreamHandle stream) {
  int device = -1;
  MUON_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
  return device;
}
#else
int device_of(StreamHandle) {
  return -1;
}
#endif

}  // namespace

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
  if (!default_stream) {
    owner = device_of(stream);
    if (owner < 0) return;  // a runtime before 12.8: only the default streams are checked
  }
  if (owner != device) {
    throw InvalidArgument(what + ": the stream belongs to CUDA device " + std::to_string(owner) +
                          " but the connection's data plane lives on device " +
                          std::to_string(device) +
                          " (push from the device the client was created on)");
  }
}

}  // namespace muon::client
