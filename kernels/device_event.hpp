// An owned CUDA event (timing disabled), for the server's GPU data plane and the client's device
// planes. Only for files built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"

namespace muon {

/// A cudaEvent_t created at construction, destroyed with it. A stream waiting on an event that
/// was never recorded does not wait: the first step of a parameter waits for nothing it has not
/// produced. Throws DeviceError when the event cannot be created.
struct OwnedEvent {
  cudaEvent_t e = make();
  OwnedEvent() = default;
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  ~OwnedEvent() { MUON_CUDA_CHECK_NOTHROW(cudaEventDestroy(e)); }

 private:
  static cudaEvent_t make() {
    cudaEvent_t e = nullptr;
    MUON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
};

}  // namespace muon
