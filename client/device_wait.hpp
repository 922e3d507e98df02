// Waits with a deadline on CUDA work of the client's device planes, for their teardown: a stream
// may wait on an event a server that is gone will never record (cuda_ipc) or on an NCCL receive
// it will never send, and CUDA has no timeout of its own (gpu-review F2, F6). CUDA builds only
// (device_wait.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>

namespace muon::client {

/// How long a teardown waits for the plane's pending copies before it leaks their memory.
inline constexpr std::chrono::milliseconds kTeardownDeadline{10000};

/// True once `event` (nullptr: none) has completed, polling cudaEventQuery every 100 us until
/// `timeout`; false past it. A CUDA error also returns true (reported on stderr): the event will
/// not complete later either.
bool event_done_within(cudaEvent_t event, std::chrono::milliseconds timeout) noexcept;
/// The same for all the work queued on `stream` (cudaStreamQuery).
bool stream_idle_within(cudaStream_t stream, std::chrono::milliseconds timeout) noexcept;

}  // namespace muon::client
