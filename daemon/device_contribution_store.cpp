// The reduction on the GPU data plane: the ContributionStore in device memory
// (contribution_store.hpp; the host twin is contribution_store.cpp), the plane's reduce(), and
// the fences of the shm chunks the stores copy onto the device.
// Every move is kernels/tile_reduce's reduce_tiles (__fadd_rn), the CUDA twin of the host
// store's reference, so both sum bitwise alike. Built only with CUDA.
#include <cuda_runtime_api.h>

#include <deque>

#include "core/cuda_check.hpp"
#include "daemon/device_plane_impl.hpp"
#include "daemon/step_reducer.hpp"
#include "kernels/device_convert.hpp"
#include "kernels/tile_reduce.hpp"

namespace muon::daemon {
namespace {

// Per-rank device buffers of one parameter. A chunk is added on the stream its data is ordered
// on: a session's receive stream, or (host data: a shared-memory slot) the plane's shm stream,
// which stages it first; the reduction reads the buffers on the plane's reduce stream. Moves of
// one buffer on different streams are ordered by the buffer's `used` event: recorded after
// every move, waited for before the next (device_streams.hpp). So the reduction waits for every
// rank's last chunk, whichever session's stream added it, and the next step's chunks wait for
// the reduction that read the buffer, and nothing waits for a session it has no data from.
class DeviceContributionStore final : public ContributionStore {
 public:
  DeviceContributionStore(int device, StreamHandle shm, StreamHandle reduce, HostCopyFences& fences)
      : device_(device), shm_(shm), reduce_(reduce), fences_(fences) {}

  void resize(size_t rank, int64_t elements) override {
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    while (buffers_.size() <= rank) buffers_.emplace_back();
    buffers_[rank].values.reserve(f32_bytes(elements));
  }

  void write(size_t rank, int64_t at, const Contribution& values, int64_t first, int64_t n,
             bool add) override {
    if (n == 0) return;
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const size_t esize = dtype_bytes(values.dtype);
    const auto* src = static_cast<const std::byte*>(values.data) + esize * first;
    StreamHandle stream = values.stream != nullptr ? values.stream : reduce_;
    if (!values.device) {
      // A shared-memory slot: the client rewrites it once released, so its release waits until
      // the copy out of it is done: the copy's fence (an event right after it, recorded before
      // the stream waits for the buffer, so not behind the reduction) is polled on the io thread
      // (ShmPlane::slot_released, Session::release_slots), never waited for (gpu-review F10).
      // Whether cudaMemcpyAsync from pageable memory returns before the copy is done depends on
      // the platform (the CUDA "API synchronization behavior" page: it "might be synchronous"; with
      // ATS on Grace it can be truly asynchronous), so the fence is explicit. staging_ is reused
      // by the next chunk's copy on the same stream, after this chunk's reduction (stream
      // order); growing it frees the old block, and cudaFree waits for the work that reads it.
      stream = shm_;
      staging_.reserve(esize * static_cast<size_t>(n));
      MUON_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), src, esize * static_cast<size_t>(n),
                                      cudaMemcpyHostToDevice, stream));
      fences_.record(stream);
      src = staging_.as<std::byte>();
    }
    const TileSource source{src, values.dtype};
    move(buffers_[rank], stream, [&] {
      reduce_tiles({&source, 1}, buffers_[rank].values.as<float>() + at, n, mode_of(add), stream);
    });
  }

  void fill_negative_zero(float* out, int64_t n) override {
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    fill_device(out, n, -0.0f, reduce_);
  }

  void read(size_t rank, int64_t at, float* out, int64_t n, bool add) override {
    if (n == 0) return;
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const TileSource source{buffers_[rank].values.as<float>() + at, TileDType::f32};
    move(buffers_[rank], reduce_, [&] {
      reduce_tiles({&source, 1}, out, n, mode_of(add), reduce_);
    });
  }

 private:
  struct RankBuffer {
    DeviceBuffer values;
    OwnedEvent used;  // after the latest move in or out of `values`, on whichever stream
  };
  static TileReduce mode_of(bool add) { return add ? TileReduce::accumulate : TileReduce::assign; }
  // `enqueue` (a move in or out of `b`) on `stream`, after the buffer's previous move. Always
  // waited, even on the stream that made it (a no-op there): a closed session's stream handle
  // may come back as another session's, so handles are not compared.
  template <class Enqueue>
  static void move(RankBuffer& b, StreamHandle stream, Enqueue enqueue) {
    MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, b.used.e, 0));
    enqueue();
    MUON_CUDA_CHECK(cudaEventRecord(b.used.e, stream));
  }

  int device_;
  StreamHandle shm_, reduce_;
  std::deque<RankBuffer> buffers_;  // a deque: events do not move
  DeviceBuffer staging_;            // a shared-memory chunk, copied onto the device
  HostCopyFences& fences_;          // the plane's: each staging copy's fence
};

}  // namespace

std::unique_ptr<ContributionStore> DevicePlane::make_contribution_store() {
  return std::make_unique<DeviceContributionStore>(config_.device, impl_->streams.shm.get(),
                                                   impl_->streams.reduce.get(), impl_->host_copies);
}

void DevicePlane::reduce(StepReducer& reducer, DeviceParamState& param) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  reducer.reduce(param.grad.as<float>());  // on the reduce stream, after every rank's last chunk
  MUON_CUDA_CHECK(cudaEventRecord(param.grad_ready.e, impl_->streams.reduce.get()));
}

uint64_t DevicePlane::host_copy_fence() const {
  return impl_->host_copies.latest();
}

bool DevicePlane::host_copies_done(uint64_t fence) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  return impl_->host_copies.passed(fence);
}

void DevicePlane::wait_host_copies(uint64_t fence) {
  MUON_CUDA_CHECK(cudaSetDevice(config_.device));
  impl_->host_copies.wait(fence);
}

}  // namespace muon::daemon
