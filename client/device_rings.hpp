// The device data plane of one cuda_ipc session, as the client sees it: the server's two exported
// device rings (transport::RemoteRing), opened once per process through one IPC handle cache, and
// the client's own streams for them. Plain C++ header (no CUDA types); the implementation is
// device_rings.cpp, compiled in CUDA builds only, as is its one user, plane_cuda_ipc.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/device_stream.hpp"
#include "transport/cuda_ipc_handle.hpp"

namespace muon::client {

/// The rings of a cuda_ipc session. The tx ring takes what this client sends (gradients in the
/// grad dtype, momentum loads in fp32), the rx ring holds what the server returns (updates in the
/// update dtype, fetched momentum in fp32); both have the slot count and slot bytes of HelloOk.
/// Who may use which slot when is the control plane's business (credits, push / update frames);
/// the slots' interprocess events only order the GPU work (see transport/cuda_ipc.hpp).
class DeviceRings {
 public:
  /// Opens both rings on the current CUDA device. Call it with the device whose memory the
  /// trainer pushes from and receives into current (cudaSetDevice is the caller's business);
  /// every later call of this object works on that device. The process' IPC handle cache is
  /// shared by every connection (a mapping costs up to hundreds of ms; made once per handle).
  /// Throws DeviceError (no usable GPU, CUDA refuses a handle), InvalidArgument (an inconsistent
  /// descriptor).
  DeviceRings(const transport::DeviceRingDescriptor& tx, const transport::DeviceRingDescriptor& rx);
  /// Waits for the reader and push streams and for every copy_in so far, destroys the rings'
  /// events, and unmaps each ring's allocation once no other DeviceRings of this process uses it
  /// (cudaIpcCloseMemHandle): the server may free the exported memory only after this (CUDA:
  /// freeing it while another process maps it is undefined). Never throws (reports CUDA failures).
  ~DeviceRings();
  DeviceRings(const DeviceRings&) = delete;
  DeviceRings& operator=(const DeviceRings&) = delete;

  /// Bytes of one slot (both rings).
  uint64_t slot_bytes() const;
  /// The CUDA device the rings were opened on.
  int device() const;

  // ---- tx ring (the caller's threads; one slot per thread at a time) -----------------------
  /// Copies `bytes` from `src` (device memory of this process) into tx slot `slot` on the rings'
  /// push stream (their own, non-blocking), after the work queued on `stream` so far: the push
  /// stream waits for `stream` (an event), then for the server's free event of the slot, copies,
  /// records the slot's ready event. `stream` itself never waits on the server (gpu-review F10:
  /// the trainer's stream is not tied to the server's receive stream, nor through it to other
  /// ranks). Returns once enqueued: the source must stay alive and unchanged until the push
  /// stream has passed the copy (record it there: push_stream()). The rings' device must be
  /// current and `stream` one of its streams (Connection::push_device sees to both).
  /// Throws InvalidArgument (bytes > slot_bytes, slot out of range), DeviceError.
  void copy_in(uint32_t slot, const void* src, size_t bytes, StreamHandle stream);
  /// The same from host memory (pageable or pinned); the copy is complete only after
  /// sync_host_pushes().
  void copy_in_host(uint32_t slot, const void* src, size_t bytes);
  /// Blocks until every copy_in and copy_in_host so far is done (the caller may then reuse its
  /// buffers).
  void sync_host_pushes();
  /// The stream every copy into the tx ring runs on.
  StreamHandle push_stream() const;

  // ---- rx ring (the connection's reader thread only) --------------------------------------
  /// Makes the rings' device current on the calling thread (the reader thread calls it before
  /// any other rx call or DeviceHold allocation).
  void enter_reader_thread();
  /// The reader's own stream (non-blocking): rx copies into holding buffers run there.
  StreamHandle reader_stream() const;
  /// On the reader stream: waits until rx slot `slot` is ready, copies `bytes` of it to `dst`
  /// (device memory of this process), marks the slot free. Returns once enqueued.
  void copy_out(uint32_t slot, void* dst, size_t bytes);
  /// The same into host memory; returns once the bytes are in `dst`.
  void copy_out_to_host(uint32_t slot, void* dst, size_t bytes);
  /// Marks rx slot `slot` free without reading it (a chunk this client does not keep).
  void release(uint32_t slot);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon::client
