// The server's GPU data plane: everything a parameter's step touches lives in device memory of
// the server's GPU. Per parameter: each contributing rank's fp32 buffer (ContributionStore), the
// reduced gradient, the fp32 momentum, the update. Per session on the cuda_ipc plane: a receive
// ring and a result ring exported over CUDA IPC (transport/cuda_ipc.hpp); on the nccl plane the
// same rings stay local and are filled and drained by ncclRecv/ncclSend on two session streams
// (two 2-rank communicators, daemon/nccl_session.hpp). Sessions on the shm plane are served too:
// their host slots staged onto the device, their updates read back to the host once per step.
//
// Streams (drawn in daemon/device_streams.hpp): each session reduces its chunks into their
// ranks' buffers on a receive stream of its own; shm chunks on one shm stream; a step's last
// commit sums the ranks on the reduce stream (after every rank's last chunk, by events) and
// records grad_ready; the worker's compute stream runs the Muon step (kernels/device_muon.hpp);
// the return stream copies updates into result slots. The control plane's credits say who may
// use which slot; the events only order GPU work. The server's copies between a parameter and
// host memory (update and gradient read-backs, momentum both ways, an owner's update) go through
// page-locked blocks on the reduce and return streams and complete through the Engine's
// CompletionQueue: the io thread never waits for them. The waited-for copies left (fills at
// make_param, the tests' reads, a cuda_ipc momentum load's slot) run on a host stream that
// waits on nothing of a client's but that load's slot; a result chunk that waited for
// a credit is copied from host memory on a staging stream that waits only for the slot's
// previous reader. The reduction order and grouping are the host's (daemon/step_reducer.hpp),
// so the reduced gradient is bitwise the CPU server's; the Newton-Schulz is the CUDA backend's.
//
// The calls are defined by stage (device_plane.cpp lists the files). The header names no CUDA
// type. In builds without CUDA every constructor throws BackendUnavailable
// (daemon/device_plane_none.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "daemon/contribution_store.hpp"
#include "kernels/device_stream.hpp"
#include "transport/cuda_ipc_handle.hpp"
#include "transport/messages.hpp"
#include "transport/nccl_id.hpp"

namespace muon::daemon {

class StepReducer;
class StepRunner;
class ParamStorage;
class CompletionQueue;
struct NsJob;

/// Start-up settings of the GPU data plane (flags of muon-offloadd).
struct DevicePlaneConfig {
  int device = 0;  ///< CUDA device ordinal
  /// Of the compute stream (--stream-priority); the copy streams run at the device's greatest
  /// priority, the NCCL streams at the default.
  StreamPriority priority = StreamPriority::normal;
  bool capture_graphs = false;  ///< CUDA graphs per shape (--cuda-graphs)
};

/// A parameter's device buffers and events (opaque; made by DevicePlane::make_param).
class DeviceParamState;
/// A session's exported rings (opaque; made by DevicePlane::make_session_rings).
class DeviceSessionRings;

/// Threads a DevicePlane starts and joins (daemon/owned_threads.hpp).
class OwnedThreads;

/// Releases what DevicePlane made; usable as unique_ptr/shared_ptr deleters.
struct DeviceParamStateDeleter {
  void operator()(DeviceParamState* p) const noexcept;
};
/// An nccl session's rings go on a teardown thread of their plane (communicators first), which
/// ~DevicePlane joins; once the plane is gone, on the calling thread.
struct DeviceSessionRingsDeleter {
  std::shared_ptr<OwnedThreads> teardowns;
  void operator()(DeviceSessionRings* p) const noexcept;
};
using DeviceParamPtr = std::unique_ptr<DeviceParamState, DeviceParamStateDeleter>;
using DeviceRingsPtr = std::shared_ptr<DeviceSessionRings>;

class DevicePlane {
 public:
  /// Selects config.device, creates the streams and the device Muon step. Throws
  /// BackendUnavailable when no usable GPU is present or the build has no CUDA (the message says
  /// why), DeviceError when CUDA fails.
  explicit DevicePlane(const DevicePlaneConfig& config);
  ~DevicePlane();
  DevicePlane(const DevicePlane&) = delete;
  DevicePlane& operator=(const DevicePlane&) = delete;

  const DevicePlaneConfig& config() const { return config_; }

  // ---- parameters (io thread) ----------------------------------------------------------------
  /// Device buffers for a parameter of `numel` fp32 elements (momentum only when `momentum`),
  /// zero-filled. Throws DeviceError (e.g. out of memory).
  DeviceParamPtr make_param(int64_t numel, bool momentum);
  /// A parameter's ParamStorage on this plane (make_param's buffers behind the calls below),
  /// whose copies to the host complete through `completions` (polled on the io thread); it
  /// must outlive neither the plane nor `completions`. Throws DeviceError.
  std::unique_ptr<ParamStorage> make_storage(int64_t numel, bool momentum,
                                             CompletionQueue& completions);
  /// A contribution store in device memory: chunks added on the stream their Contribution names
  /// (a session's receive stream; host chunks staged on the shm stream, each copy fenced:
  /// host_copies_done), the reduction on the reduce stream.
  std::unique_ptr<ContributionStore> make_contribution_store();
  /// Enqueues the reduction of the complete `reducer` into the parameter's gradient on the
  /// reduce stream (after every rank's last chunk) and records grad_ready. Throws as
  /// StepReducer::reduce, DeviceError.
  void reduce(StepReducer& reducer, DeviceParamState& param);
  /// Copies momentum[offset, offset + count) to/from host fp32, and update[offset, offset +
  /// count) to host fp32, waited for (tests and tools; the server uses the copies below).
  /// Throws DeviceError.
  void read_momentum(const DeviceParamState& param, int64_t offset, int64_t count, float* out);
  void write_momentum(DeviceParamState& param, int64_t offset, const float* in, int64_t count);
  void read_update(const DeviceParamState& param, int64_t offset, int64_t count, float* out);

  // ---- copies between a parameter and host memory that never wait (io thread) ---------------
  /// Whether a copy enqueued below is done (cudaEventQuery after it; never waits; throws
  /// DeviceError when it failed). It holds what the copy needs (its event) until dropped.
  using CopyDone = std::function<bool()>;
  /// `floats` fp32 of page-locked host memory for the copies below (pooled; daemon/pinned_blocks
  /// .hpp): keep it until the copy's CopyDone said true. Throws DeviceError.
  std::shared_ptr<float> pinned(int64_t floats);
  /// Each copies into or out of page-locked `host` (numel fp32, or `count` from `offset`) and
  /// returns at once; the stream says what it is ordered after, and what comes after it:
  /// - read_momentum_async, write_momentum_async (reduce stream; only while the parameter is not
  ///   computing): after the steps reduced before, before the next step's grad_ready, so the
  ///   next Muon step sees a written momentum;
  /// - read_grad_async (reduce stream): the gradient of the reduction just enqueued (relayed
  ///   parameters, daemon/pool/relay.hpp);
  /// - read_update_async (return stream): after the result slots' copies enqueued before it,
  ///   before the `released` of the updates_enqueued() that follows;
  /// - write_update_async (return stream): an update from the owner into the parameter's update
  ///   buffer, after the copies out of the previous one, before those of this one (send_update
  ///   returns it like a computed one).
  /// Throw DeviceError, InvalidArgument (momentum of a parameter that keeps none).
  CopyDone read_momentum_async(const DeviceParamState& param, float* host);
  CopyDone write_momentum_async(DeviceParamState& param, int64_t offset, const float* host,
                                int64_t count);
  CopyDone read_grad_async(const DeviceParamState& param, float* host);
  CopyDone read_update_async(const DeviceParamState& param, float* host);
  CopyDone write_update_async(DeviceParamState& param, const float* host);

  // ---- sessions on the shm plane (io thread) -------------------------------------------------
  /// The fence of the latest copy of a shared-memory chunk onto the device (a contribution
  /// store's staging, on the shm stream); 0 before the first.
  uint64_t host_copy_fence() const;
  /// Whether every such copy up to `fence` is done on the GPU (cudaEventQuery; never waits):
  /// the chunk's slot may then be acked (daemon/planes/shm_plane.hpp). Throws DeviceError.
  bool host_copies_done(uint64_t fence);
  /// Blocks until every such copy up to `fence` is done: a closing shm session's segment is
  /// unmapped only then. Throws DeviceError.
  void wait_host_copies(uint64_t fence);

  // ---- the worker thread ---------------------------------------------------------------------
  /// The Scheduler's runner for jobs on this plane (NsJob::device): the Muon step on the compute
  /// stream, same-shape batches in one call (daemon/step/step_runner.hpp). Use it on one thread
  /// (the worker's); destroy it before the plane. Throws DeviceError.
  std::unique_ptr<StepRunner> step_runner();

  // ---- sessions on the cuda_ipc plane (io thread) --------------------------------------------
  /// A receive ring (tx, client -> server) and a result ring (rx) of the given slots, exported,
  /// and the session's receive stream.
  DeviceRingsPtr make_session_rings(uint32_t tx_slots, uint32_t rx_slots, uint64_t slot_bytes);
  static const transport::DeviceRingDescriptor& tx_descriptor(const DeviceSessionRings& rings);
  static const transport::DeviceRingDescriptor& rx_descriptor(const DeviceSessionRings& rings);
  /// Orders the session's receive stream after the client's write of tx slot `slot` (cuda_ipc:
  /// its ready event; nccl: first posts the matching ncclRecv of `count` elements of `dtype` into
  /// the slot on the session's NCCL stream); returns the slot as a device Contribution on that
  /// receive stream. Pair with end_receive, also when the push fails. Throws DeviceError,
  /// InvalidArgument (nccl: before the join finished).
  Contribution begin_receive(DeviceSessionRings& rings, uint32_t slot, int64_t count,
                             transport::DType dtype);
  /// Records the slot's free event on the session's receive stream, after the work enqueued
  /// since begin_receive.
  void end_receive(DeviceSessionRings& rings, uint32_t slot);
  /// cuda_ipc: whether the client's copy into tx slot `slot` (its ready event), or out of rx
  /// slot `slot` (its free event), is done on the GPU (cudaEventQuery; never waits), for
  /// Session::gate_frames: the streams here then never wait on a client's event that may never
  /// come (gpu-review F2). True on the nccl plane (its events are this process' own). Throws
  /// InvalidArgument (slot out of range), DeviceError.
  bool tx_slot_written(const DeviceSessionRings& rings, uint32_t slot);
  bool rx_slot_read(const DeviceSessionRings& rings, uint32_t slot);
  /// Copies `bytes` of tx slot `slot` to host memory (blocking; momentum loads).
  void read_tx_slot(DeviceSessionRings& rings, uint32_t slot, void* out, size_t bytes);
  /// What follows the update frame that announces a result slot, once the frame is written
  /// (Session::AfterFrame): on the nccl plane the slot's ncclSend, posted only then, so that no
  /// send spins on the GPU for a frame the io thread has not written (gpu-review F1); empty on
  /// the cuda_ipc plane (the client copies the slot after the frame).
  using SlotSend = std::function<void()>;
  /// On the return stream: waits rx slot `slot`'s free event, writes update[offset, offset +
  /// count) of `param` into it as `dtype` (bf16: narrowed as transport::f32_to_bf16), records the
  /// slot's ready event. Returns without waiting. nccl: the copy (or narrowing) runs on the
  /// session's send stream, which the return stream then waits for; the returned SlotSend sends
  /// the slot. Throws InvalidArgument (a chunk that does not fit), DeviceError.
  SlotSend send_update(DeviceSessionRings& rings, uint32_t slot, const DeviceParamState& param,
                       int64_t offset, int64_t count, transport::DType dtype);
  /// The same for host bytes (chunks that waited for a credit, momentum of state_fetch) of
  /// elements of `dtype`: copied before it returns, so `data` may go.
  SlotSend send_host(DeviceSessionRings& rings, uint32_t slot, const void* data, size_t bytes,
                     transport::DType dtype);
  // ---- sessions on the nccl plane (io thread) -----------------------------------------------
  /// Rings as above (local to this process) plus two fresh ncclUniqueIds: tx (gradients, client
  /// -> server) and rx (updates). Throws BackendUnavailable when the build has no NCCL.
  DeviceRingsPtr make_nccl_session(uint32_t tx_slots, uint32_t rx_slots, uint64_t slot_bytes);
  /// The session's (tx, rx) ids; throws InvalidArgument for a session not on the nccl plane.
  static std::pair<transport::NcclIdBytes, transport::NcclIdBytes> nccl_ids(
      const DeviceSessionRings& rings);
  /// Joins both communicators as rank 0 (tx, then rx, as the client does) on a thread of its
  /// own, waiting up to `timeout` for the client, then calls `done` on that thread with "" or
  /// the error. Data-plane calls on the session before `done("")` throw InvalidArgument. The
  /// plane owns the thread (never detached): ~DevicePlane waits for joins still in progress,
  /// each at most `timeout`, so `done` never runs after the plane is gone.
  void join_nccl(const DeviceRingsPtr& rings, std::chrono::milliseconds timeout,
                 std::function<void(const std::string& error)> done);

  /// Every copy of the parameter's current update is enqueued: its next step may overwrite it
  /// once the return stream passed them (records `released`).
  void updates_enqueued(DeviceParamState& param);

 private:
  /// nccl: the SlotSend of `bytes` of rx slot `slot`. It refers to the rings, which the Session
  /// holds until it is closed; a Session runs it only while open.
  SlotSend slot_send(DeviceSessionRings& rings, uint32_t slot, size_t bytes,
                     transport::DType dtype);
  /// `floats` fp32 values between host and device memory on the host stream, waited for.
  void copy_blocking(void* dst, const void* src, int64_t floats);
  /// `floats` fp32 values between page-locked host and device memory on `stream` (one of
  /// streams.reduce, streams.ret), then an event; the CopyDone queries it.
  CopyDone copy_async(void* dst, const void* src, int64_t floats, StreamHandle stream);
  struct Impl;
  DevicePlaneConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon::daemon
