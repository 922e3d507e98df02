// Device contributor-order tile reduction (see tile_reduce.hpp). Every add is __fadd_rn: nvcc
// never contracts or reorders it, so each element is the host's left-to-right sum, bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/tile_reduce.hpp"

namespace muon {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;

// The sources of one launch, passed by value (kernel parameters).
struct LaunchSources {
  const void* data[kMaxTilesPerLaunch];
  unsigned bf16_mask;  // bit j: source j is bf16
  int count;
};

__device__ __forceinline__ float load(const LaunchSources& s, int j, int64_t i) {
  return (s.bf16_mask >> j) & 1u ? __bfloat162float(static_cast<const __nv_bfloat16*>(s.data[j])[i])
                                 : static_cast<const float*>(s.data[j])[i];
}

__global__ void __launch_bounds__(kThreads)
    reduce_kernel(LaunchSources sources, float* __restrict__ accumulator, int64_t n, bool assign) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float acc = assign ? load(sources, 0, i) : __fadd_rn(accumulator[i], load(sources, 0, i));
    for (int j = 1; j < sources.count; ++j) acc = __fadd_rn(acc, load(sources, j, i));
    accumulator[i] = acc;
  }
}

}  // namespace

void reduce_tiles(std::span<const TileSource> sources, float* accumulator, int64_t count,
                  TileReduce mode, StreamHandle stream) {
  if (count < 0) throw InvalidArgument("reduce_tiles: negative count " + std::to_string(count));
  if (sources.empty() && mode == TileReduce::assign) {
    throw InvalidArgument("reduce_tiles: assign needs at least one source");
  }
  if (count == 0) return;
  if (accumulator == nullptr) throw InvalidArgument("reduce_tiles: null accumulator");
  const auto grid =
      static_cast<unsigned>(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, kMaxGrid));
  for (const TileReduceLaunch& l : plan_tile_reduce(sources.size(), mode)) {
    LaunchSources s{};
    s.count = static_cast<int>(l.count);
    for (size_t j = 0; j < l.count; ++j) {
      const TileSource& src = sources[l.first + j];
      if (src.data == nullptr) throw InvalidArgument("reduce_tiles: null source tile");
      s.data[j] = src.data;
      if (src.dtype == DType::bf16) s.bf16_mask |= 1u << j;
    }
    reduce_kernel<<<grid, kThreads, 0, stream>>>(s, accumulator, count, l.assign);
    MUON_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace muon
