// StepRunner on the GPU data plane's buffers (step_runner.hpp), the device twin of
// host_step_runner.cpp, and the plane's factory for it. Built only with CUDA.
#include <cuda_runtime_api.h>

#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "daemon/device_plane_impl.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/step/step_runner.hpp"

namespace muon::daemon {
namespace {

// StepRunner on device buffers (daemon/step/step_runner.hpp), on the compute stream of the
// worker thread. Every call steps the momenta in a scratch buffer (a batch's concatenation, or
// one job's copy) and commit() copies them back: a refused step never reaches a momentum. A batch
// also gathers its gradients and scatters its updates; a single job reads and writes its own.
// One pinned status word and two event waits per call (run's status, commit's copies), not per
// parameter: the worker waits for the device, the io thread never does.
class DeviceStepRunner final : public StepRunner {
 public:
  DeviceStepRunner(int device, DeviceStream& compute, DeviceMuon& muon)
      : device_(device), compute_(compute), muon_(muon) {
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    MUON_CUDA_CHECK(cudaMallocHost(&status_host_, sizeof(int)));
    status_.reserve(sizeof(int));
  }
  ~DeviceStepRunner() override { MUON_CUDA_CHECK_NOTHROW(cudaFreeHost(status_host_)); }

  bool batchable(const NsJob& job) const override { return matches(job); }

  bool run(std::span<NsJob* const> jobs) override {
    const NsJob& first = *jobs.front();
    for (const NsJob* j : jobs) {
      if (!matches(*j)) {
        throw InvalidArgument("parameter '" + j->name + "' step " + std::to_string(j->step) +
                              ": device buffers do not match shape " + j->shape.str());
      }
    }
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const auto stream = compute_.get();
    const bool keep = keeps_momentum(first);
    const bool batched = jobs.size() > 1;
    int64_t total = 0, matrices = 0;
    for (const NsJob* j : jobs) {
      total += j->shape.numel();
      matrices += j->shape.batch;
      // The gradient is reduced, and the previous update returned, before this step runs.
      MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, j->device->grad_ready.e, 0));
      MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, j->device->released.e, 0));
    }
    if (keep) momentum_.reserve(f32_bytes(total));
    if (batched) {
      grad_.reserve(f32_bytes(total));
      update_.reserve(f32_bytes(total));
    }
    int64_t at = 0;
    for (const NsJob* j : jobs) {
      const int64_t n = j->shape.numel();
      if (keep) copy(momentum_.as<float>() + at, j->device->momentum.as<float>(), n);
      if (batched) copy(grad_.as<float>() + at, j->device->grad.as<float>(), n);
      at += n;
    }
    const MatrixShape shape =
        batched ? MatrixShape{matrices, first.shape.rows, first.shape.cols} : first.shape;
    const std::string name =
        batched ? first.name + " (+" + std::to_string(jobs.size() - 1) + " batched)" : first.name;
    MUON_CUDA_CHECK(cudaMemsetAsync(status_.get(), 0, sizeof(int), stream));
    muon_.step(name, shape, batched ? grad_.as<float>() : first.device->grad.as<float>(),
               keep ? momentum_.as<float>() : nullptr,
               batched ? update_.as<float>() : first.device->update.as<float>(), first.options,
               stream, status_.as<int>());
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(status_host_, status_.get(), sizeof(int), cudaMemcpyDeviceToHost, stream));
    wait();
    const int status = *status_host_;
    if (status & kDeviceInputNonFinite) {  // update zero (device_muon.hpp)
      if (batched) throw Error(name + ": a gradient holds NaN or Inf; its jobs run alone");
      if (first.options.orthogonalize.nonfinite == NonFinitePolicy::skip) return false;
      throw NonFiniteError("matrix '" + first.name + "' " + first.shape.str() +
                           ": input holds NaN or Inf; step refused, momentum untouched");
    }
    if (status & kDeviceOutputNonFinite) {
      throw Error("parameter '" + first.name + "' step " + std::to_string(first.step) +
                  ": Newton-Schulz produced NaN or Inf from a finite input (bf16 overflow?); "
                  "step refused, momentum untouched");
    }
    return true;
  }

  void commit(std::span<NsJob* const> jobs) override {
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const bool keep = keeps_momentum(*jobs.front());
    const bool batched = jobs.size() > 1;
    int64_t at = 0;
    for (NsJob* j : jobs) {
      const int64_t n = j->shape.numel();
      if (keep) copy(j->device->momentum.as<float>(), momentum_.as<float>() + at, n);
      if (batched) copy(j->device->update.as<float>(), update_.as<float>() + at, n);
      if (j->sample_health) sample_copy(*j, keep);
      at += n;
    }
    // Done before the results go to the io thread: its reads of momentum and update (snapshots,
    // host chunks) run on other streams.
    wait();
  }

 private:
  static bool matches(const NsJob& job) {
    return job.device != nullptr && job.device->numel == job.shape.numel() &&
           (!keeps_momentum(job) || job.device->has_momentum);
  }
  // Numeric health (Scheduler::sample_health, on the host): the update, and what the check
  // rebuilds the Newton-Schulz input from: the reduced gradient (the step only read it) and the
  // stepped momentum. Enqueued after commit's copies back, so it reads the committed momentum.
  void sample_copy(NsJob& job, bool keep) {
    const int64_t n = job.shape.numel();
    const auto stream = compute_.get();
    job.update.resize(static_cast<size_t>(n));
    job.grad.resize(static_cast<size_t>(n));
    MUON_CUDA_CHECK(cudaMemcpyAsync(job.update.data(), job.device->update.get(), f32_bytes(n),
                                    cudaMemcpyDeviceToHost, stream));
    MUON_CUDA_CHECK(cudaMemcpyAsync(job.grad.data(), job.device->grad.get(), f32_bytes(n),
                                    cudaMemcpyDeviceToHost, stream));
    if (keep) {
      job.sampled_momentum.resize(static_cast<size_t>(n));
      MUON_CUDA_CHECK(cudaMemcpyAsync(job.sampled_momentum.data(), job.device->momentum.get(),
                                      f32_bytes(n), cudaMemcpyDeviceToHost, stream));
    }
  }
  void copy(float* dst, const float* src, int64_t n) {
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, f32_bytes(n), cudaMemcpyDeviceToDevice, compute_.get()));
  }
  void wait() {
    MUON_CUDA_CHECK(cudaEventRecord(done_.e, compute_.get()));
    MUON_CUDA_CHECK(cudaEventSynchronize(done_.e));
  }

  int device_;
  DeviceStream& compute_;
  DeviceMuon& muon_;
  DeviceBuffer grad_, momentum_, update_;  // scratch: a batch's concatenation (momentum: always)
  DeviceBuffer status_;                    // kDevice* bits of the last call
  int* status_host_ = nullptr;             // pinned copy of status_
  OwnedEvent done_;
};

}  // namespace

std::unique_ptr<StepRunner> DevicePlane::step_runner() {
  return std::make_unique<DeviceStepRunner>(config_.device, impl_->streams.compute, impl_->muon);
}

}  // namespace muon::daemon
