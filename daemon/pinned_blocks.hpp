// Page-locked host blocks for the GPU data plane's copies between device and host memory that
// must not block the io thread (daemon/step/device_param_storage.cpp): cudaMemcpyAsync into or
// out of pageable memory may return only once the copy is done ("API synchronization behavior"
// in the CUDA runtime API reference); into or out of page-locked memory it returns at once.
// Blocks are reused: one that its last holder drops goes back to the pool (page-locking is
// slow: it maps and pins every page). Only for files built with CUDA.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace muon::daemon {

class PinnedBlocks {
 public:
  /// At least the asked fp32 values in page-locked host memory; back to the pool when the last
  /// copy of the pointer goes (on any thread), freed then if the pool is gone.
  using Block = std::shared_ptr<float>;

  PinnedBlocks() = default;
  PinnedBlocks(const PinnedBlocks&) = delete;
  PinnedBlocks& operator=(const PinnedBlocks&) = delete;

  /// A block of at least `floats` fp32 (> 0): a pooled one no more than twice that size, else a
  /// new one (cudaMallocHost). Throws DeviceError (out of page-locked memory).
  Block take(int64_t floats);

 private:
  struct Pool {
    ~Pool();  // frees the pooled blocks; those still held are freed as they go
    std::mutex mu;
    std::multimap<int64_t, float*> free;  // by size in floats
  };
  std::shared_ptr<Pool> pool_ = std::make_shared<Pool>();
};

}  // namespace muon::daemon
