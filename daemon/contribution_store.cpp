#include "daemon/contribution_store.hpp"

#include <algorithm>
#include <vector>

#include "core/error.hpp"
#include "kernels/streaming_copy.hpp"

namespace muon::daemon {
namespace {

// Every move is the reference reduction of kernels/tile_reduce.hpp with one source (the device
// store's kernels are its CUDA twin), so host and device sums agree bit for bit; a first fp32
// write into a large buffer is the same copy with streaming stores.
TileReduce mode_of(bool add) {
  return add ? TileReduce::accumulate : TileReduce::assign;
}

class HostContributionStore final : public ContributionStore {
 public:
  void resize(size_t rank, int64_t elements) override {
    if (buffers_.size() <= rank) buffers_.resize(rank + 1);
    buffers_[rank].resize(static_cast<size_t>(elements));
  }

  void write(size_t rank, int64_t at, const Contribution& values, int64_t first, int64_t n,
             bool add) override {
    if (values.device) {
      throw InvalidArgument("a host contribution store cannot read device memory");
    }
    const size_t esize = values.dtype == TileDType::bf16 ? 2 : 4;
    const auto* data = static_cast<const std::byte*>(values.data) + esize * first;
    auto& buffer = buffers_[rank];
    // An fp32 chunk's first write into a large buffer streams past the caches
    // (kernels/streaming_copy.hpp): the same bits as the reduction's copy.
    if (!add && values.dtype == TileDType::f32 &&
        buffer.size() * sizeof(float) >= kStreamingCopyBytes) {
      copy_streaming(buffer.data() + at, reinterpret_cast<const float*>(data), n);
      return;
    }
    const TileSource source{data, values.dtype};
    reduce_tiles_host({&source, 1}, buffer.data() + at, n, mode_of(add));
  }

  void fill_negative_zero(float* out, int64_t n) override { std::fill(out, out + n, -0.0f); }

  void read(size_t rank, int64_t at, float* out, int64_t n, bool add) override {
    const TileSource source{buffers_[rank].data() + at, TileDType::f32};
    reduce_tiles_host({&source, 1}, out, n, mode_of(add));
  }

 private:
  std::vector<std::vector<float>> buffers_;
};

}  // namespace

std::unique_ptr<ContributionStore> make_host_contribution_store() {
  return std::make_unique<HostContributionStore>();
}

}  // namespace muon::daemon
