#include "daemon/pinned_blocks.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace muon::daemon {

PinnedBlocks::Pool::~Pool() {
  for (auto& [floats, p] : free) MUON_CUDA_CHECK_NOTHROW(cudaFreeHost(p));
}

PinnedBlocks::Block PinnedBlocks::take(int64_t floats) {
  if (floats <= 0) throw InvalidArgument("a page-locked block of " + std::to_string(floats) +
                                         " floats");
  float* p = nullptr;
  int64_t size = floats;
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    auto it = pool_->free.lower_bound(floats);
    if (it != pool_->free.end() && it->first <= 2 * floats) {
      size = it->first;
      p = it->second;
      pool_->free.erase(it);
    }
  }
  if (p == nullptr) {
    void* raw = nullptr;
    MUON_CUDA_CHECK(cudaMallocHost(&raw, static_cast<size_t>(floats) * sizeof(float)));
    p = static_cast<float*>(raw);
  }
  return Block(p, [pool = std::weak_ptr<Pool>(pool_), size](float* q) {
    if (auto owner = pool.lock()) {
      std::lock_guard<std::mutex> lock(owner->mu);
      owner->free.emplace(size, q);
      return;
    }
    MUON_CUDA_CHECK_NOTHROW(cudaFreeHost(q));
  });
}

}  // namespace muon::daemon
