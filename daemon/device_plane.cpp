// The GPU data plane's life (device_plane.hpp): its streams and device Muon step made, its
// threads joined and its queued work finished before anything it made goes. Its calls live by
// stage: step/device_param_storage.cpp (a parameter's buffers), device_contribution_store.cpp
// (the reduction), step/device_step_runner.cpp (the worker's step), device_session_rings.cpp
// (the sessions' rings), device_nccl_sessions.cpp (the nccl plane's communicators). Built only
// with CUDA.
#include "daemon/device_plane.hpp"

#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "daemon/device_plane_impl.hpp"
#include "kernels/device_probe.hpp"
#include "kernels/device_sync_guard.hpp"

namespace muon::daemon {

DevicePlane::DevicePlane(const DevicePlaneConfig& config) : config_(config) {
  if (auto why = cuda_unavailable_reason(config.device + 1); !why.empty()) {
    throw BackendUnavailable("GPU data plane: " + why);
  }
  MUON_CUDA_CHECK(cudaSetDevice(config.device));
  impl_ = std::make_unique<Impl>(config);
}

DevicePlane::~DevicePlane() {
  if (impl_) {
    impl_->joiners.join_all();     // before the sync: a join's warm-up transfers end with it
    impl_->teardowns->join_all();  // sessions' communicators, then their rings
    MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(config_.device));
    const auto sync = device_sync_scope();             // not during a graph capture (gpu-review F7)
    MUON_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());  // nothing queued may outlive its buffers
  }
}

}  // namespace muon::daemon
