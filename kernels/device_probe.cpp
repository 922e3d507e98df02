#include "kernels/device_probe.hpp"

#include <cuda_runtime_api.h>

namespace muon {

std::string cuda_unavailable_reason(int min_devices) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess) {
    cudaGetLastError();  // reset the last-error state so later calls report their own
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
  }
  if (devices < min_devices) {
    return "needs " + std::to_string(min_devices) + " CUDA device" + (min_devices == 1 ? "" : "s") +
           ", " + std::to_string(devices) + " visible";
  }
  return {};
}

}  // namespace muon
