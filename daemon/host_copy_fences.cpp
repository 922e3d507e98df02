#include "daemon/host_copy_fences.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"

namespace muon::daemon {

uint64_t HostCopyFences::record(StreamHandle stream) {
  std::unique_ptr<OwnedEvent> event;
  if (spare_.empty()) {
    event = std::make_unique<OwnedEvent>();
  } else {
    event = std::move(spare_.back());
    spare_.pop_back();
  }
  MUON_CUDA_CHECK(cudaEventRecord(event->e, stream));
  pending_.emplace_back(++recorded_, std::move(event));
  return recorded_;
}

bool HostCopyFences::passed(uint64_t fence) {
  while (done_ < fence && !pending_.empty()) {
    const cudaError_t status = cudaEventQuery(pending_.front().second->e);
    if (status == cudaErrorNotReady) return false;
    MUON_CUDA_CHECK(status);
    done_ = pending_.front().first;
    spare_.push_back(std::move(pending_.front().second));
    pending_.pop_front();
  }
  return done_ >= fence;
}

void HostCopyFences::wait(uint64_t fence) {
  while (done_ < fence && !pending_.empty()) {
    MUON_CUDA_CHECK(cudaEventSynchronize(pending_.front().second->e));
    done_ = pending_.front().first;
    spare_.push_back(std::move(pending_.front().second));
    pending_.pop_front();
  }
}

}  // namespace muon::daemon
