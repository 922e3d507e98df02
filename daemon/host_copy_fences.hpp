// The GPU data plane's copies out of host memory (shm chunks staged onto the device, on the shm
// stream, daemon/device_streams.hpp), numbered in the order they were enqueued, and whether the
// GPU has done them. The io thread releases a shm chunk's slot once its copy is done, polled
// (Session::release_slots), instead of waiting for it. Only for files built with CUDA; io thread
// only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/device_event.hpp"
#include "kernels/device_stream.hpp"

namespace muon::daemon {

class HostCopyFences {
 public:
  /// Marks the copy just enqueued on `stream` (every copy on one stream, so they finish in
  /// order); returns its fence: 1, 2, ... Throws DeviceError.
  uint64_t record(StreamHandle stream);
  /// The fence of the latest copy recorded; 0 before the first.
  uint64_t latest() const { return recorded_; }
  /// Whether every copy up to `fence` is done on the GPU (cudaEventQuery; never waits). Throws
  /// DeviceError when a copy failed.
  bool passed(uint64_t fence);
  /// Blocks until every copy up to `fence` is done. Throws DeviceError.
  void wait(uint64_t fence);

 private:
  std::deque<std::pair<uint64_t, std::unique_ptr<OwnedEvent>>> pending_;  // oldest first
  std::vector<std::unique_ptr<OwnedEvent>> spare_;  // passed events, recorded again later
  uint64_t recorded_ = 0;
  uint64_t done_ = 0;  // every fence up to here has passed
};

}  // namespace muon::daemon
