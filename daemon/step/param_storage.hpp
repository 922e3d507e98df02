// Where a parameter's step buffers live: host memory (CPU backend, or --host-staging), or device
// memory of the server's GPU data plane (DevicePlane::make_storage). The Engine holds one per
// owned or relayed parameter and never asks which: the reducer's contribution store, the reduced
// gradient, the momentum's copies and the update's way out go through here.
//
// ParamState::momentum is the host copy of the momentum in both cases: the truth on the host, a
// copy refreshed from the device (refresh_momentum) for snapshots and state fetches otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "daemon/contribution_store.hpp"

namespace muon::daemon {

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
  /// Reduces the complete step into `grad` (numel host fp32): what a relay forwards to the owner.
  virtual void reduce_to_host(StepReducer& reducer, std::vector<float>& grad) = 0;

  /// Refreshes `host` (numel fp32) from the device momentum; nothing on the host. Blocking.
  virtual void refresh_momentum(std::vector<float>& host) = 0;
  /// Writes momentum[offset, offset + values.size()) of the device; nothing on the host.
  virtual void write_momentum(int64_t offset, std::span<const float> values) = 0;

  /// The finished step's update as host fp32 (numel), for chunks that leave through host bytes:
  /// job.update on the host, read back into it from the device (blocking). Throws DeviceError.
  virtual const float* host_update(NsJob& job) = 0;
  /// A relayed step's update from the owner (numel fp32) becomes the parameter's update, as if
  /// computed here (device: uploaded once the previous one was returned).
  virtual void upload_update(const std::vector<float>& update) = 0;
  /// Every chunk of the current update was enqueued (device: the next step may overwrite it once
  /// the return stream passed them).
  virtual void updates_enqueued() = 0;

  /// The device buffers, for data planes that copy device to device; null on the host.
  virtual DeviceParamState* device_state() = 0;
};

/// Host buffers: the reducer's store in host memory, gradients and updates in NsJob's vectors.
std::unique_ptr<ParamStorage> make_host_param_storage();

}  // namespace muon::daemon
