// Serializes CUDA graph capture against the device-synchronizing calls of other threads
// (gpu-review F7).
#pragma once

#include <mutex>
#include <shared_mutex>

namespace muon {

/// A capture in cudaStreamCaptureModeThreadLocal restricts only the capturing thread's calls,
/// but a cudaFree, cudaDeviceSynchronize or cudaIpcCloseMemHandle on another thread synchronizes
/// the whole device, and synchronizing a device while a capture is in progress invalidates that
/// capture (the capturing thread's cudaStreamEndCapture fails with
/// cudaErrorStreamCaptureInvalidated; the other thread's call may fail with error 900 or 906:
/// NVIDIA/TensorRT#2888, ROCm/rocm-systems#4508). So every such call in this process holds
/// device_sync_scope() (shared: they run side by side) and a capture holds capture_scope()
/// (exclusive) from cudaStreamBeginCapture to cudaStreamEndCapture.
///
/// Rules: a capture is short (enqueues only, no allocation: its buffers are reserved before it
/// takes the scope); never take device_sync_scope() while holding capture_scope() on the same
/// thread (std::shared_mutex is not recursive: that would deadlock).
[[nodiscard]] std::shared_lock<std::shared_mutex> device_sync_scope();

/// Exclusive counterpart of device_sync_scope(), held by a graph capture.
[[nodiscard]] std::unique_lock<std::shared_mutex> capture_scope();

}  // namespace muon
