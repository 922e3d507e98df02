// A grow-only device allocation, shared by the CUDA kernels' hosts (Newton-Schulz workspaces,
// the device Muon step, tests). Include from translation units built with the CUDA toolkit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "core/cuda_check.hpp"
#include "kernels/device_sync_guard.hpp"

namespace muon {

/// cudaMalloc'd bytes on the device current at the first reserve(). Only grows; the contents are
/// not kept across growth. Not copyable; movable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  /// Makes room for `bytes`. A reallocation frees the old block first (cudaFree synchronizes the
  /// device, so no queued work still uses it). Throws DeviceError (e.g. out of memory).
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_ != nullptr) {
      void* old = std::exchange(ptr_, nullptr);
      bytes_ = 0;
      const auto sync = device_sync_scope();  // cudaFree syncs the device: not during a capture
      MUON_CUDA_CHECK(cudaFree(old));
    }
    MUON_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (ptr_ != nullptr) {
      const auto sync = device_sync_scope();  // as in reserve()
      MUON_CUDA_CHECK_NOTHROW(cudaFree(ptr_));
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace muon
