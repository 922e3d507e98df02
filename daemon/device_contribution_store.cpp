// The reduction on the GPU data plane: the ContributionStore in device memory
// (contribution_store.hpp; the host twin is contribution_store.cpp) and the plane's reduce().
// Every move is kernels/tile_reduce's reduce_tiles (__fadd_rn), the CUDA twin of the host
// store's reference, so both sum bitwise alike. Built only with CUDA.
#include <cuda_runtime_api.h>

#include <optional>
#include <vector>

#include "core/cuda_check.hpp"
#include "daemon/device_plane_impl.hpp"
#include "daemon/step_reducer.hpp"
#include "kernels/device_convert.hpp"
#include "kernels/tile_reduce.hpp"

namespace muon::daemon {
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
    const size_t esize = dtype_bytes(values.dtype);
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

std::unique_ptr<ContributionStore> DevicePlane::make_contribution_store() {
  return std::make_unique<DeviceContributionStore>(config_.device, impl_->streams.receive.get());
}

void DevicePlane::reduce(StepReducer& reducer, DeviceParamState& param) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  reducer.reduce(param.grad.as<float>());
  MUON_CUDA_CHECK(cudaEventRecord(param.grad_ready.e, impl_->streams.receive.get()));
}

}  // namespace muon::daemon
