// Host <-> device copies and pointer checks for the client's device entry points (push_device,
// wait_update_device) on a session whose data plane is host shared memory: the bytes are staged
// through host memory. Plain C++ header; device_copy.cpp in CUDA builds, device_unavailable.cpp
// (throws BackendUnavailable) otherwise.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/device_stream.hpp"

namespace muon::client {

/// True when this client library was built with CUDA (the device entry points can work).
bool built_with_cuda();

/// Checks that `ptr` is CUDA device (or managed) memory of this process (cudaPointerGetAttributes).
/// `what` names the argument in the message. Throws InvalidArgument (host or unknown memory),
/// DeviceError (CUDA fails, e.g. no usable GPU: "CUDA driver version is insufficient"),
/// BackendUnavailable (built without CUDA).
void require_device_memory(const void* ptr, const std::string& what);

/// Copies `bytes` from device memory to host memory on `stream` (cudaMemcpyAsync) and waits for
/// the stream (cudaStreamSynchronize): the copy is ordered after the work already on `stream`.
/// Throws DeviceError, BackendUnavailable.
void copy_device_to_host(void* host_dst, const void* device_src, size_t bytes, StreamHandle stream);

/// Copies `bytes` from host memory to device memory on `stream` and waits for the stream.
/// Throws DeviceError, BackendUnavailable.
void copy_host_to_device(void* device_dst, const void* host_src, size_t bytes, StreamHandle stream);

}  // namespace muon::client
