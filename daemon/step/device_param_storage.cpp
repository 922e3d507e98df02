// A parameter's buffers on the GPU data plane: the plane's per-parameter calls
// (device_plane.hpp: make_param, the blocking copies of momentum, update and gradient, the
// `released` record) and the ParamStorage over them (param_storage.hpp), the device twin of
// host_param_storage.cpp. Built only with CUDA.
#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
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

void DevicePlane::read_grad(DeviceParamState& param, float* out) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaStreamWaitEvent(impl_->streams.host.get(), param.grad_ready.e, 0));
  copy_blocking(out, param.grad.as<float>(), param.numel);
}

void DevicePlane::write_update(DeviceParamState& param, const float* in) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaStreamWaitEvent(impl_->streams.host.get(), param.released.e, 0));
  copy_blocking(param.update.as<float>(), in, param.numel);
}

void DevicePlane::updates_enqueued(DeviceParamState& param) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaEventRecord(param.released.e, impl_->streams.ret.get()));
}

namespace {

class DeviceParamStorage final : public ParamStorage {
 public:
  DeviceParamStorage(DevicePlane& plane, int64_t numel, bool momentum)
      : plane_(plane), param_(plane.make_param(numel, momentum)) {}

  std::unique_ptr<ContributionStore> make_contribution_store() override {
    return plane_.make_contribution_store();
  }
  void reduce(StepReducer& reducer, NsJob& job) override {
    plane_.reduce(reducer, *param_);
    job.device = param_.get();
  }
  void reduce_to_host(StepReducer& reducer, std::vector<float>& grad) override {
    plane_.reduce(reducer, *param_);
    plane_.read_grad(*param_, grad.data());
  }
  void refresh_momentum(std::vector<float>& host) override {
    if (param_->has_momentum) {
      plane_.read_momentum(*param_, 0, static_cast<int64_t>(host.size()), host.data());
    }
  }
  void write_momentum(int64_t offset, std::span<const float> values) override {
    if (param_->has_momentum) {
      plane_.write_momentum(*param_, offset, values.data(), static_cast<int64_t>(values.size()));
    }
  }
  const float* host_update(NsJob& job) override {
    job.update.resize(static_cast<size_t>(param_->numel));
    plane_.read_update(*param_, 0, param_->numel, job.update.data());
    return job.update.data();
  }
  void upload_update(const std::vector<float>& update) override {
    plane_.write_update(*param_, update.data());
  }
  void updates_enqueued() override { plane_.updates_enqueued(*param_); }
  DeviceParamState* device_state() override { return param_.get(); }

 private:
  DevicePlane& plane_;
  DeviceParamPtr param_;
};

}  // namespace

std::unique_ptr<ParamStorage> DevicePlane::make_storage(int64_t numel, bool momentum) {
  return std::make_unique<DeviceParamStorage>(*this, numel, momentum);
}

}  // namespace muon::daemon
