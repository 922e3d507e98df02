#include "daemon/contribution_store.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "kernels/bf16.hpp"

namespace muon::daemon {
namespace {

// dst[i] += src[i]; the buffers never overlap, which lets the compiler vectorize (elementwise
// adds: same bits as the scalar loop).
void add_into(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
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
    float* dst = buffers_[rank].data() + at;
    if (values.dtype == TileDType::f32) {
      const float* src = static_cast<const float*>(values.data) + first;
      if (add) {
        add_into(dst, src, n);
      } else {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      }
      return;
    }
    const auto* src = static_cast<const std::byte*>(values.data) + 2 * first;
    if (!add) {
      widen_to_f32(DType::bf16, src, std::span(dst, static_cast<size_t>(n)));
      return;
    }
    widened_.resize(static_cast<size_t>(n));
    widen_to_f32(DType::bf16, src, widened_);
    add_into(dst, widened_.data(), n);
  }

  void fill_negative_zero(float* out, int64_t n) override { std::fill(out, out + n, -0.0f); }

  void read(size_t rank, int64_t at, float* out, int64_t n, bool add) override {
    const float* src = buffers_[rank].data() + at;
    if (add) {
      add_into(out, src, n);
    } else {
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
    }
  }

 private:
  std::vector<std::vector<float>> buffers_;
  std::vector<float> widened_;  // a bf16 chunk widened before it is added
};

}  // namespace

std::unique_ptr<ContributionStore> make_host_contribution_store() {
  return std::make_unique<HostContributionStore>();
}

}  // namespace muon::daemon
