// A client-owned device buffer that holds one complete update of a parameter between the moment
// the connection's reader thread copies it out of the server's rx ring and the moment the trainer
// asks for it (the server returns parameters in its own order, the trainer waits for them in its
// own: updates must not stay in ring slots meanwhile): the UpdateHold of the device data planes
// (cuda_ipc, nccl). Plain C++ header; the implementation is device_hold.cpp, compiled in CUDA
// builds only (the planes that make one are too).
#pragma once

#include <cstddef>
#include <memory>

#include "client/update_hold.hpp"
#include "kernels/device_stream.hpp"

namespace muon::client {

/// `bytes` of device memory (cudaMalloc on the current device) with two events that order its
/// reuse: `filled` (recorded by the reader after the last chunk of a step was copied in) and
/// `consumed` (recorded by the consumer after copying the update out). The reader waits for
/// `consumed` before writing into the buffer again; consumers wait for `filled`.
class DeviceHold final : public UpdateHold {
 public:
  /// Throws DeviceError (allocation or event creation failed).
  explicit DeviceHold(size_t bytes);
  /// Waits until no copy into or out of the buffer is pending, then frees it. At most 10 s: a
  /// copy still pending then (its stream waits on a server that is gone) leaves the memory
  /// allocated (leaked, reported on stderr) rather than freed under it.
  ~DeviceHold() override;
  DeviceHold(const DeviceHold&) = delete;
  DeviceHold& operator=(const DeviceHold&) = delete;

  size_t bytes() const override;
  /// Device address of the buffer (nullptr when bytes() is 0).
  void* data() const override;

  /// Reader, before the first chunk of a step: `stream` waits until the last consumer's copy
  /// out of the buffer is done.
  void begin_fill(StreamHandle stream) override;
  /// Reader, after the step's last chunk was enqueued on `stream`: records `filled`.
  void end_fill(StreamHandle stream) override;

  /// Consumer: on `stream`, waits for `filled`, copies bytes() to `dst` (device memory), records
  /// `consumed`. Returns once enqueued; `stream` must belong to the buffer's device.
  void copy_to_device(void* dst, StreamHandle stream) override;
  /// Consumer: blocks until `filled`, then copies bytes() to `dst` (host memory) synchronously.
  void copy_to_host(void* dst) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon::client
