// A parameter's buffers on the GPU data plane: the plane's per-parameter calls
// (device_plane.hpp: make_param, the copies of momentum, update and gradient, the `released`
// record) and the ParamStorage over them (param_storage.hpp), the device twin of
// host_param_storage.cpp. The server's copies go through page-locked blocks and complete through
// the Engine's CompletionQueue: the io thread never waits for the device. Built only with CUDA.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "daemon/completion_queue.hpp"
#include "daemon/device_plane_impl.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/step/param_storage.hpp"

namespace muon::daemon {

void DeviceParamStateDeleter::operator()(DeviceParamState* p) const noexcept {
  delete p;
}

DeviceParamPtr DevicePlane::make_param(int64_t numel, bool momentum) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  DeviceParamPtr p(new DeviceParamState);
  p->numel = numel;
  p->has_momentum = momentum;
  p->grad.reserve(f32_bytes(numel));
  p->update.reserve(f32_bytes(numel));
  // On a stream of this plane and waited for: a legacy-stream memset would not be ordered
  // before the non-blocking streams' first use (e.g. a restored momentum's upload).
  const auto stream = impl_->streams.host.get();
  MUON_CUDA_CHECK(cudaMemsetAsync(p->update.get(), 0, f32_bytes(numel), stream));
  if (momentum) {
    p->momentum.reserve(f32_bytes(numel));
    MUON_CUDA_CHECK(cudaMemsetAsync(p->momentum.get(), 0, f32_bytes(numel), stream));
  }
  impl_->streams.host.synchronize();
  return p;
}

void DevicePlane::copy_blocking(void* dst, const void* src, int64_t floats) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, f32_bytes(floats), cudaMemcpyDefault, impl_->streams.host.get()));
  impl_->streams.host.synchronize();
}

void DevicePlane::read_momentum(const DeviceParamState& param, int64_t offset, int64_t count,
                                float* out) {
  if (!param.has_momentum) throw InvalidArgument("this parameter keeps no momentum");
  copy_blocking(out, param.momentum.as<float>() + offset, count);
}

void DevicePlane::write_momentum(DeviceParamState& param, int64_t offset, const float* in,
                                 int64_t count) {
  if (!param.has_momentum) throw InvalidArgument("this parameter keeps no momentum");
  copy_blocking(param.momentum.as<float>() + offset, in, count);
}

void DevicePlane::read_update(const DeviceParamState& param, int64_t offset, int64_t count,
                              float* out) {
  copy_blocking(out, param.update.as<float>() + offset, count);
}

std::shared_ptr<float> DevicePlane::pinned(int64_t floats) {
  return impl_->pinned.take(floats);
}

DevicePlane::CopyDone DevicePlane::copy_async(void* dst, const void* src, int64_t floats,
                                              StreamHandle stream) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaMemcpyAsync(dst, src, f32_bytes(floats), cudaMemcpyDefault, stream));
  auto done = std::make_shared<OwnedEvent>();
  MUON_CUDA_CHECK(cudaEventRecord(done->e, stream));
  return [done] {
    const cudaError_t status = cudaEventQuery(done->e);
    if (status == cudaErrorNotReady) return false;
    MUON_CUDA_CHECK(status);
    return true;
  };
}

DevicePlane::CopyDone DevicePlane::read_momentum_async(const DeviceParamState& param,
                                                       float* host) {
  if (!param.has_momentum) throw InvalidArgument("this parameter keeps no momentum");
  return copy_async(host, param.momentum.as<float>(), param.numel, impl_->streams.reduce.get());
}

DevicePlane::CopyDone DevicePlane::write_momentum_async(DeviceParamState& param, int64_t offset,
                                                        const float* host, int64_t count) {
  if (!param.has_momentum) throw InvalidArgument("this parameter keeps no momentum");
  return copy_async(param.momentum.as<float>() + offset, host, count,
                    impl_->streams.reduce.get());
}

DevicePlane::CopyDone DevicePlane::read_grad_async(const DeviceParamState& param, float* host) {
  // The reduction that fills the gradient is on this stream already (reduce, grad_ready).
  return copy_async(host, param.grad.as<float>(), param.numel, impl_->streams.reduce.get());
}

DevicePlane::CopyDone DevicePlane::read_update_async(const DeviceParamState& param, float* host) {
  return copy_async(host, param.update.as<float>(), param.numel, impl_->streams.ret.get());
}

DevicePlane::CopyDone DevicePlane::write_update_async(DeviceParamState& param, const float* host) {
  return copy_async(param.update.as<float>(), host, param.numel, impl_->streams.ret.get());
}

void DevicePlane::updates_enqueued(DeviceParamState& param) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaEventRecord(param.released.e, impl_->streams.ret.get()));
}

namespace {

class DeviceParamStorage final : public ParamStorage {
 public:
  DeviceParamStorage(DevicePlane& plane, int64_t numel, bool momentum,
                     CompletionQueue& completions)
      : plane_(plane), completions_(completions), param_(plane.make_param(numel, momentum)) {}

  std::unique_ptr<ContributionStore> make_contribution_store() override {
    return plane_.make_contribution_store();
  }
  void reduce(StepReducer& reducer, NsJob& job) override {
    plane_.reduce(reducer, *param_);
    job.device = param_.get();
  }
  void reduce_to_host(StepReducer& reducer, std::vector<float>& grad, Done then) override {
    plane_.reduce(reducer, *param_);
    auto block = plane_.pinned(param_->numel);
    auto done = plane_.read_grad_async(*param_, block.get());
    const auto n = static_cast<size_t>(param_->numel);
    completions_.when(std::move(done),
                      [block, &grad, n, then = std::move(then)](std::exception_ptr e) {
                        if (!e) std::copy_n(block.get(), n, grad.data());
                        then(e);
                      });
  }
  void refresh_momentum(std::vector<float>& host, Done then) override {
    if (!param_->has_momentum) {
      then(nullptr);
      return;
    }
    auto block = plane_.pinned(param_->numel);
    auto done = plane_.read_momentum_async(*param_, block.get());
    completions_.when(std::move(done),
                      [block, &host, then = std::move(then)](std::exception_ptr e) {
                        if (!e) std::copy_n(block.get(), host.size(), host.data());
                        then(e);
                      });
  }
  void write_momentum(int64_t offset, std::span<const float> values) override {
    if (!param_->has_momentum || values.empty()) return;
    const auto count = static_cast<int64_t>(values.size());
    auto block = plane_.pinned(count);
    std::copy(values.begin(), values.end(), block.get());
    // The block stays until the copy is done; a failure shows at the next step's reduction.
    completions_.when(plane_.write_momentum_async(*param_, offset, block.get(), count),
                      [block](std::exception_ptr) {});
  }
  void read_update(NsJob&, HostValues then) override {
    auto block = plane_.pinned(param_->numel);
    auto done = plane_.read_update_async(*param_, block.get());
    completions_.when(std::move(done),
                      [block, then = std::move(then)](std::exception_ptr e) {
                        then(e ? nullptr : block.get(), e);
                      });
  }
  void upload_update(const std::vector<float>& update) override {
    auto block = plane_.pinned(param_->numel);
    std::copy_n(update.data(), static_cast<size_t>(param_->numel), block.get());
    completions_.when(plane_.write_update_async(*param_, block.get()),
                      [block](std::exception_ptr) {});
  }
  void updates_enqueued() override { plane_.updates_enqueued(*param_); }
  DeviceParamState* device_state() override { return param_.get(); }

 private:
  DevicePlane& plane_;
  OwnedCompletions completions_;  // runs a continuation only while this storage lives
  DeviceParamPtr param_;
};

}  // namespace

std::unique_ptr<ParamStorage> DevicePlane::make_storage(int64_t numel, bool momentum,
                                                       CompletionQueue& completions) {
  return std::make_unique<DeviceParamStorage>(*this, numel, momentum, completions);
}

}  // namespace muon::daemon
