// Device copies of host vectors for the GPU tests: allocate, upload, download. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"

namespace muon::testing {

/// `count` elements of T in device memory (cudaMalloc), freed on destruction.
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t count) : count_(count) {
    MUON_CUDA_CHECK(cudaMalloc(&ptr_, bytes() == 0 ? 1 : bytes()));
  }
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) { upload(host); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { MUON_CUDA_CHECK_NOTHROW(cudaFree(ptr_)); }

  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  /// Copies `host` in and waits until the bytes are on the device: a pageable cudaMemcpy may
  /// return once they are staged, and work on a non-blocking stream is not ordered after it.
  void upload(const std::vector<T>& host) {
    MUON_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
    MUON_CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// Waits for all work on the device, then copies back.
  std::vector<T> download() const {
    std::vector<T> host(count_);
    MUON_CUDA_CHECK(cudaDeviceSynchronize());
    MUON_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t count_;
};

}  // namespace muon::testing
