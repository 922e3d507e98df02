// Where a parameter's step buffers live: host memory (CPU backend, or --host-staging), or device
// memory of the server's GPU data plane (DevicePlane::make_storage). The Engine holds one per
// owned or relayed parameter and never asks which: the reducer's contribution store, the reduced
// gradient, the momentum's copies and the update's way out go through here.
//
// ParamState::momentum is the host copy of the momentum in both cases: the truth on the host, a
// copy refreshed from the device (refresh_momentum) for snapshots and state fetches otherwise.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "daemon/contribution_store.hpp"

namespace muon::daemon {

class CompletionQueue;
class DeviceParamState;
class StepReducer;
struct NsJob;

class ParamStorage {
 public:
  virtual ~ParamStorage() = default;

  /// The store for the parameter's StepReducer (host or device buffers).
  virtual std::unique_ptr<ContributionStore> make_contribution_store() = 0;

  /// Reduces the complete step (StepReducer::reduce) into the job's gradient: host storage fills
  /// job.grad (resized to numel fp32; the caller hands in last step's warm buffer), device
  /// storage the device gradient (and sets job.device). Throws as StepReducer::reduce,
  /// DeviceError.
  virtual void reduce(StepReducer& reducer, NsJob& job) = 0;
  /// What a copy to the host hands on: null when it is done, else the error that stopped it
  /// (DeviceError).
  using Done = std::function<void(std::exception_ptr error)>;
  /// A copy's values in host fp32 (valid only during the call), or null and the error.
  using HostValues = std::function<void(const float* values, std::exception_ptr error)>;

  // The copies to the host below never block the io thread: host storage calls `then` before
  // it returns (the values are already there); device storage enqueues a copy into page-locked
  // memory and calls `then` from the Engine's CompletionQueue once the copy is done, and only
  // while this storage lives (its parameter may be unregistered meanwhile: then nothing runs).
  // Continuations run in the order their copies were asked for.

  /// Reduces the complete step into `grad` (numel host fp32), then `then`: what a relay
  /// forwards to the owner. `grad` must live until `then` ran (or this storage is gone). Throws
  /// as StepReducer::reduce, DeviceError (enqueueing).
  virtual void reduce_to_host(StepReducer& reducer, std::vector<float>& grad, Done then) = 0;

  /// Refreshes `host` (numel fp32, the parameter's ParamState::momentum) from the device
  /// momentum, then `then`; host storage: nothing to copy. Call only while the parameter is not
  /// computing. Throws DeviceError (enqueueing).
  virtual void refresh_momentum(std::vector<float>& host, Done then) = 0;
  /// Writes momentum[offset, offset + values.size()) of the device (copied before it returns;
  /// ordered before the parameter's next step); nothing on the host. Throws DeviceError.
  virtual void write_momentum(int64_t offset, std::span<const float> values) = 0;

  /// The finished step's update (numel fp32) in host memory, for chunks that leave through
  /// host bytes: job.update on the host, a read-back on the device (enqueued before the
  /// updates_enqueued() that follows, so the next step does not overwrite it first). Throws
  /// DeviceError (enqueueing).
  virtual void read_update(NsJob& job, HostValues then) = 0;
  /// A relayed step's update from the owner (numel fp32) becomes the parameter's update, as if
  /// computed here (device: copied before it returns, uploaded once the previous one was
  /// returned).
  virtual void upload_update(const std::vector<float>& update) = 0;
  /// Every chunk of the current update was enqueued (device: the next step may overwrite it once
  /// the return stream passed them).
  virtual void updates_enqueued() = 0;

  /// The device buffers, for data planes that copy device to device; null on the host.
  virtual DeviceParamState* device_state() = 0;
};

/// Host buffers: the reducer's store in host memory, gradients and updates in NsJob's vectors.
/// Continuations run before each call returns; with `deferred`, through that queue instead (a
/// poll later, only while the storage lives), as on the GPU data plane: the CPU tests then run
/// the device path's continuations (ServerConfig::defer_host_copies).
std::unique_ptr<ParamStorage> make_host_param_storage(CompletionQueue* deferred = nullptr);

}  // namespace muon::daemon
