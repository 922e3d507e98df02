// Where one parameter's update waits between the moment the connection's reader thread copies it
// out of the server's rx ring and the moment the trainer asks for it (the server returns
// parameters in its own order, the trainer waits for them in its own: updates must not stay in
// ring slots meanwhile). Each data plane makes its own kind (ClientPlane::make_hold): host memory
// on shm (plane_shm.cpp), device memory on cuda_ipc and nccl (DeviceHold, device_hold.hpp).
#pragma once

#include <cstddef>

#include "kernels/device_stream.hpp"

namespace muon::client {

/// bytes() of memory the plane's receives write into (host or device memory, as the plane that
/// made it says), filled by the reader and read by consumers, one step at a time.
class UpdateHold {
 public:
  virtual ~UpdateHold() = default;

  virtual size_t bytes() const = 0;
  /// Address of the buffer, in the memory of the plane that made it (nullptr when bytes() is 0).
  virtual void* data() const = 0;

  /// Reader, before the first chunk of a step: `stream` (the plane's reader stream) waits until
  /// the last consumer's copy out of the buffer is done. Nothing to wait for in host memory.
  virtual void begin_fill(StreamHandle stream) = 0;
  /// Reader, after the step's last chunk was enqueued on `stream`: marks the buffer filled.
  virtual void end_fill(StreamHandle stream) = 0;

  /// Consumer: waits until filled, copies bytes() to `dst` (device memory of the plane's device)
  /// on `stream`; returns once enqueued. Throws InvalidArgument for a hold in host memory (a
  /// shm session: the connection refuses device waits before), DeviceError.
  virtual void copy_to_device(void* dst, StreamHandle stream) = 0;
  /// Consumer: waits until filled, then copies bytes() to `dst` (host memory) synchronously.
  virtual void copy_to_host(void* dst) = 0;
};

}  // namespace muon::client
