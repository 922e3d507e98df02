// The server's GPU data plane (see device_plane.hpp). Built only with CUDA.
#include "daemon/device_plane.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "daemon/nccl_session.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/step/param_storage.hpp"
#include "daemon/step/step_runner.hpp"
#include "daemon/step_reducer.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_convert.hpp"
#include "kernels/device_event.hpp"
#include "kernels/device_muon.hpp"
#include "kernels/device_probe.hpp"
#include "kernels/device_sync_guard.hpp"
#include "kernels/tile_reduce.hpp"
#include "transport/cuda_ipc.hpp"

namespace muon::daemon {
namespace {

size_t f32_bytes(int64_t n) {
  return static_cast<size_t>(n) * sizeof(float);
}

}  // namespace

class DeviceParamState {
 public:
  int64_t numel = 0;
  bool has_momentum = false;
  DeviceBuffer grad, momentum, update;
  OwnedEvent grad_ready, released;
};

class DeviceSessionRings {
 public:
  DeviceSessionRings(uint32_t tx_slots, uint32_t rx_slots, uint64_t slot_bytes)
      : tx(tx_slots, slot_bytes), rx(rx_slots, slot_bytes) {}
  transport::DeviceRing tx, rx;
  std::shared_ptr<NcclSession> nccl;  // null on the cuda_ipc plane (daemon/nccl_session.hpp)
};

// Threads the plane starts and joins, never detached: the finished ones are joined when the next
// one starts, the rest by join_all (~DevicePlane), after which start() refuses (the caller then
// runs the work itself). So none outlives the plane, nor the Engine and io_context that the
// work's callbacks post to.
class OwnedThreads {
 public:
  /// Runs `work` on a new thread; false (nothing started) once join_all ran.
  bool start(std::function<void()> work) {
    join_finished();
    auto finished = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard lock(mu_);
    if (closed_) return false;
    threads_.push_back({std::thread([work = std::move(work), finished] {
                          work();
                          *finished = true;
                        }),
                        finished});
    return true;
  }
  void join_finished() {
    std::vector<Owned> done;
    {
      std::lock_guard lock(mu_);
      for (auto it = threads_.begin(); it != threads_.end();) {
        if (it->finished->load()) {
          done.push_back(std::move(*it));
          it = threads_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& t : done) t.thread.join();
  }
  /// Joins every thread (each ends within its own deadline) and refuses new ones.
  void join_all() {
    std::vector<Owned> all;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      all.swap(threads_);
    }
    for (auto& t : all) t.thread.join();
  }

 private:
  struct Owned {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::mutex mu_;
  std::vector<Owned> threads_;
  bool closed_ = false;
};

void DeviceParamStateDeleter::operator()(DeviceParamState* p) const noexcept {
  delete p;
}
void DeviceSessionRingsDeleter::operator()(DeviceSessionRings* p) const noexcept {
  if (p == nullptr) return;
  if (!p->nccl) {
    delete p;
    return;
  }
  // Off the io thread, communicators first: destroying them ends (aborts, after a dead peer)
  // the transfers still queued into the rings, which cudaFree would otherwise wait for.
  auto teardown = [p] {
    cudaSetDevice(nccl_session_device(*p->nccl));
    p->nccl.reset();
    delete p;
  };
  try {
    if (teardowns && teardowns->start(teardown)) return;
  } catch (const std::exception&) {  // no thread to be had: do it here
  }
  teardown();
}

struct DevicePlane::Impl {
  // The copy streams at the device's greatest priority, so that a chunk's reduction or return
  // is never queued behind Newton-Schulz kernels (their own or a co-located trainer's); only the
  // compute stream takes --stream-priority (gpu-review F9). NCCL's streams keep the default
  // priority (make_nccl_session).
  explicit Impl(const DevicePlaneConfig& c)
      : receive(StreamPriority::high),
        compute(c.priority),
        ret(StreamPriority::high),
        host(StreamPriority::high),
        staging(StreamPriority::high),
        muon(DeviceMuonConfig{c.device, c.capture_graphs}) {}
  // `host` carries the io thread's blocking copies (momentum, update read-back, fills): the
  // receive and return streams wait on clients' events, and a host thread must not wait on them.
  DeviceStream receive, compute, ret, host;
  DeviceStream staging;  // host chunks into result slots (send_host)
  DeviceMuon muon;       // the worker thread's only

  // The NCCL joining threads (join_nccl; each within its join timeout) and the nccl sessions'
  // teardown threads (each within NCCL's finalize deadline), joined in ~DevicePlane.
  OwnedThreads joiners;
  std::shared_ptr<OwnedThreads> teardowns = std::make_shared<OwnedThreads>();
};

namespace {

// Per-rank device buffers of one parameter; every move on the receive stream.
class DeviceContributionStore final : public ContributionStore {
 public:
  DeviceContributionStore(int device, StreamHandle stream) : device_(device), stream_(stream) {}

  void resize(size_t rank, int64_t elements) override {
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    if (buffers_.size() <= rank) buffers_.resize(rank + 1);
    buffers_[rank].reserve(f32_bytes(elements));
  }

  void write(size_t rank, int64_t at, const Contribution& values, int64_t first, int64_t n,
             bool add) override {
    if (n == 0) return;
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const size_t esize = values.dtype == TileDType::bf16 ? 2 : 4;
    const auto* src = static_cast<const std::byte*>(values.data) + esize * first;
    if (!values.device) {
      // A shared-memory slot: the caller acks it when this returns, and the client rewrites it,
      // so the copy out of it must be complete by then. Wait for that copy alone (an event right
      // after it), not for the reduction behind it (a stream sync per chunk did: gpu-review F10).
      // Whether cudaMemcpyAsync from pageable memory returns before the copy is done depends on
      // the platform (the CUDA "API synchronization behavior" page: it "might be synchronous";
      // with ATS on Grace it can be truly asynchronous), so the wait is explicit. staging_ is
      // reused by the next chunk's copy on the same stream, after this chunk's reduction (stream
      // order); growing it frees the old block, and cudaFree waits for the work that reads it.
      staging_.reserve(esize * static_cast<size_t>(n));
      MUON_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), src, esize * static_cast<size_t>(n),
                                      cudaMemcpyHostToDevice, stream_));
      if (!copied_) copied_.emplace();
      MUON_CUDA_CHECK(cudaEventRecord(copied_->e, stream_));
      src = staging_.as<std::byte>();
    }
    const TileSource source{src, values.dtype};
    reduce_tiles({&source, 1}, buffers_[rank].as<float>() + at, n,
                 add ? TileReduce::accumulate : TileReduce::assign, stream_);
    if (!values.device) MUON_CUDA_CHECK(cudaEventSynchronize(copied_->e));  // the slot is free
  }

  void fill_negative_zero(float* out, int64_t n) override {
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    fill_device(out, n, -0.0f, stream_);
  }

  void read(size_t rank, int64_t at, float* out, int64_t n, bool add) override {
    if (n == 0) return;
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const TileSource source{buffers_[rank].as<float>() + at, TileDType::f32};
    reduce_tiles({&source, 1}, out, n, add ? TileReduce::accumulate : TileReduce::assign, stream_);
  }

 private:
  int device_;
  StreamHandle stream_;
  std::vector<DeviceBuffer> buffers_;
  DeviceBuffer staging_;
  std::optional<OwnedEvent> copied_;  // recorded after each shared-memory chunk's copy
};

}  // namespace

DevicePlane::DevicePlane(const DevicePlaneConfig& config) : config_(config) {
  if (auto why = cuda_unavailable_reason(config.device + 1); !why.empty()) {
    throw BackendUnavailable("GPU data plane: " + why);
  }
  MUON_CUDA_CHECK(cudaSetDevice(config.device));
  impl_ = std::make_unique<Impl>(config);
}

DevicePlane::~DevicePlane() {
  if (impl_) {
    impl_->joiners.join_all();     // before the sync: a join's warm-up transfers end with it
    impl_->teardowns->join_all();  // sessions' communicators, then their rings
    MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(config_.device));
    const auto sync = device_sync_scope();  // not during a graph capture (gpu-review F7)
    MUON_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());  // nothing queued may outlive its buffers
  }
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
  const auto stream = impl_->host.get();
  MUON_CUDA_CHECK(cudaMemsetAsync(p->update.get(), 0, f32_bytes(numel), stream));
  if (momentum) {
    p->momentum.reserve(f32_bytes(numel));
    MUON_CUDA_CHECK(cudaMemsetAsync(p->momentum.get(), 0, f32_bytes(numel), stream));
  }
  impl_->host.synchronize();
  return p;
}

std::unique_ptr<ContributionStore> DevicePlane::make_contribution_store() {
  return std::make_unique<DeviceContributionStore>(config_.device, impl_->receive.get());
}

void DevicePlane::reduce(StepReducer& reducer, DeviceParamState& param) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  reducer.reduce(param.grad.as<float>());
  MUON_CUDA_CHECK(cudaEventRecord(param.grad_ready.e, impl_->receive.get()));
}

void DevicePlane::copy_blocking(void* dst, const void* src, int64_t floats) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, f32_bytes(floats), cudaMemcpyDefault, impl_->host.get()));
  impl_->host.synchronize();
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
  MUON_CUDA_CHECK(cudaStreamWaitEvent(impl_->host.get(), param.grad_ready.e, 0));
  copy_blocking(out, param.grad.as<float>(), param.numel);
}

void DevicePlane::write_update(DeviceParamState& param, const float* in) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaStreamWaitEvent(impl_->host.get(), param.released.e, 0));
  copy_blocking(param.update.as<float>(), in, param.numel);
}

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

namespace {

// ParamStorage on the GPU data plane (daemon/step/param_storage.hpp): the plane's per-parameter
// calls on the parameter's device buffers.
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

std::unique_ptr<StepRunner> DevicePlane::step_runner() {
  return std::make_unique<DeviceStepRunner>(config_.device, impl_->compute, impl_->muon);
}

DeviceRingsPtr DevicePlane::make_session_rings(uint32_t tx_slots, uint32_t rx_slots,
                                               uint64_t slot_bytes) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return DeviceRingsPtr(new DeviceSessionRings(tx_slots, rx_slots, slot_bytes),
                        DeviceSessionRingsDeleter{impl_->teardowns});
}

const transport::DeviceRingDescriptor& DevicePlane::tx_descriptor(const DeviceSessionRings& r) {
  return r.tx.descriptor();
}
const transport::DeviceRingDescriptor& DevicePlane::rx_descriptor(const DeviceSessionRings& r) {
  return r.rx.descriptor();
}

const void* DevicePlane::begin_receive(DeviceSessionRings& rings, uint32_t slot, int64_t count,
                                       transport::DType dtype) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  // nccl: the client's ncclSend of this chunk, received in push order.
  if (rings.nccl) nccl_receive(*rings.nccl, rings.tx, slot, count, dtype);
  rings.tx.wait_ready(slot, impl_->receive.get());
  return rings.tx.slot(slot);
}

void DevicePlane::end_receive(DeviceSessionRings& rings, uint32_t slot) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  rings.tx.mark_free(slot, impl_->receive.get());
}

bool DevicePlane::tx_slot_written(const DeviceSessionRings& rings, uint32_t slot) {
  if (rings.nccl) return true;
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return rings.tx.ready_reached(slot);
}

bool DevicePlane::rx_slot_read(const DeviceSessionRings& rings, uint32_t slot) {
  if (rings.nccl) return true;
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return rings.rx.free_reached(slot);
}

void DevicePlane::read_tx_slot(DeviceSessionRings& rings, uint32_t slot, void* out, size_t bytes) {
  if (bytes > rings.tx.slot_bytes()) throw InvalidArgument("read past a receive slot");
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  const auto stream = impl_->host.get();  // waits for this client's write only
  rings.tx.wait_ready(slot, stream);
  MUON_CUDA_CHECK(cudaMemcpyAsync(out, rings.tx.slot(slot), bytes, cudaMemcpyDeviceToHost, stream));
  impl_->host.synchronize();
}

DevicePlane::SlotSend DevicePlane::send_update(DeviceSessionRings& rings, uint32_t slot,
                                               const DeviceParamState& param, int64_t offset,
                                               int64_t count, transport::DType dtype) {
  const size_t bytes = static_cast<size_t>(count) * transport::dtype_bytes(dtype);
  if (offset < 0 || count < 0 || offset + count > param.numel || bytes > rings.rx.slot_bytes()) {
    throw InvalidArgument("update chunk [" + std::to_string(offset) + ", " +
                          std::to_string(offset + count) + ") does not fit a result slot");
  }
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  const float* src = param.update.as<float>() + offset;
  if (rings.nccl) {  // the client posts the matching ncclRecv when the update frame arrives
    nccl_stage_update(*rings.nccl, rings.rx, slot, src, count, dtype, impl_->ret.get());
    return slot_send(rings, slot, bytes, dtype);
  }
  const auto stream = impl_->ret.get();
  rings.rx.wait_free(slot, stream);
  if (dtype == transport::DType::f32) {
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(rings.rx.slot(slot), src, bytes, cudaMemcpyDeviceToDevice, stream));
  } else {
    narrow_to_bf16_device(src, static_cast<uint16_t*>(rings.rx.slot(slot)), count, stream);
  }
  rings.rx.mark_ready(slot, stream);
  return {};
}

DevicePlane::SlotSend DevicePlane::slot_send(DeviceSessionRings& rings, uint32_t slot, size_t bytes,
                                             transport::DType dtype) {
  // Holds the session's NCCL state, not the rings' owner: a session closed before its frame
  // was written drops this unrun (Session::finish).
  return [device = config_.device, n = rings.nccl, &rx = rings.rx, slot, bytes, dtype] {
    MUON_CUDA_CHECK(cudaSetDevice(device));
    nccl_send_slot(*n, rx, slot, bytes, dtype);
  };
}

DevicePlane::SlotSend DevicePlane::send_host(DeviceSessionRings& rings, uint32_t slot,
                                             const void* data, size_t bytes,
                                             transport::DType dtype) {
  if (bytes > rings.rx.slot_bytes()) throw InvalidArgument("host chunk larger than a result slot");
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  // The copy from pageable memory runs on a stream of its own and is waited for here (so
  // `data` may go): the return and send streams also wait on other clients' progress, which may
  // depend on frames this io thread has not written yet. The staging stream waits only for the
  // slot's previous reader, which the client has already been told about (it returned the
  // credit), so this wait ends.
  const auto staging = impl_->staging.get();
  rings.rx.wait_free(slot, staging);
  MUON_CUDA_CHECK(
      cudaMemcpyAsync(rings.rx.slot(slot), data, bytes, cudaMemcpyHostToDevice, staging));
  rings.rx.mark_ready(slot, staging);
  impl_->staging.synchronize();
  // nccl: then sent from the slot on the session's send stream, once the frame is out.
  return rings.nccl ? slot_send(rings, slot, bytes, dtype) : SlotSend{};
}

DeviceRingsPtr DevicePlane::make_nccl_session(uint32_t tx_slots, uint32_t rx_slots,
                                              uint64_t slot_bytes) {
  auto nccl = open_nccl_session(config_.device);  // BackendUnavailable without NCCL
  auto rings = make_session_rings(tx_slots, rx_slots, slot_bytes);
  rings->nccl = std::move(nccl);
  return rings;
}

std::pair<transport::NcclIdBytes, transport::NcclIdBytes> DevicePlane::nccl_ids(
    const DeviceSessionRings& rings) {
  if (!rings.nccl) throw InvalidArgument("not an nccl session");
  return nccl_session_ids(*rings.nccl);
}

void DevicePlane::join_nccl(const DeviceRingsPtr& rings, std::chrono::milliseconds timeout,
                            std::function<void(const std::string& error)> done) {
  if (!rings || !rings->nccl) throw InvalidArgument("not an nccl session");
  // The thread holds the NCCL state, not the rings: a session closed meanwhile frees its rings;
  // the communicators go when the thread is done with them.
  const bool started = impl_->joiners.start([n = rings->nccl, timeout, done = std::move(done)] {
    try {
      join_nccl_session(*n, timeout);
      done("");
    } catch (const std::exception& e) {
      done(e.what());
    }
  });
  if (!started) throw InvalidArgument("the GPU data plane is shutting down");
}

void DevicePlane::updates_enqueued(DeviceParamState& param) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  MUON_CUDA_CHECK(cudaEventRecord(param.released.e, impl_->ret.get()));
}

}  // namespace muon::daemon
