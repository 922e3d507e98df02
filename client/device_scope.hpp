// The device of a client call on a device data plane: the plane's CUDA device made current for
// the call (the caller's restored after), and the caller's stream checked against it. Plain C++
// header; device_scope.cpp in CUDA builds, device_unavailable.cpp (throws BackendUnavailable)
// otherwise.
#pragma once

#include <string>

#include "kernels/device_stream.hpp"

namespace muon::client {

/// cudaSetDevice(device) for the lifetime of the object, then back to the device current before.
class DeviceScope {
 public:
  /// Throws DeviceError when CUDA refuses the device, BackendUnavailable (built without CUDA).
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  /// The device that was current before.
  int previous() const { return previous_; }

 private:
  int previous_ = 0;
  int device_ = 0;
};

/// Checks that `stream` (a cudaStream_t; nullptr, cudaStreamLegacy and cudaStreamPerThread mean
/// the stream of `caller_device`, the device current when the call began) belongs to `device`.
/// Throws InvalidArgument naming `what` and both devices; DeviceError when CUDA cannot tell. With
/// a CUDA runtime older than 12.8 (no cudaStreamGetDevice) only the default streams are checked.
void require_stream_on_device(StreamHandle stream, int device, int caller_device,
                              const std::string& what);

}  // namespace muon::client
