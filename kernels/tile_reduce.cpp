#include "kernels/tile_reduce.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "kernels/bf16.hpp"

namespace muon {
namespace {

// Element i of a tile, widened exactly to fp32.
float widen(const void* data, DType dtype, int64_t i) {
  if (dtype == DType::f32) return static_cast<const float*>(data)[i];
  uint16_t h;
  std::memcpy(&h, static_cast<const uint16_t*>(data) + i, sizeof h);
  return bf16_to_f32(h);
}

// acc[i] = acc[i] + src[i]: the general loop's arithmetic for one fp32 source, written so that
// the compiler vectorizes it (elementwise adds, the same bits; the buffers do not overlap).
void add_into(float* __restrict acc, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + src[i];
}

}  // namespace

std::vector<TileReduceLaunch> plan_tile_reduce(size_t sources, TileReduce mode) {
  std::vector<TileReduceLaunch> launches;
  for (size_t first = 0; first < sources; first += kMaxTilesPerLaunch) {
    launches.push_back({first, std::min(kMaxTilesPerLaunch, sources - first),
                        first == 0 && mode == TileReduce::assign});
  }
  return launches;
}

void reduce_tiles_host(std::span<const TileSource> sources, float* accumulator, int64_t count,
                       TileReduce mode) {
  if (count < 0) throw InvalidArgument("reduce_tiles: negative count " + std::to_string(count));
  if (sources.empty() && mode == TileReduce::assign) {
    throw InvalidArgument("reduce_tiles: assign needs at least one source");
  }
  if (count == 0) return;
  if (accumulator == nullptr) throw InvalidArgument("reduce_tiles: null accumulator");
  for (const TileSource& s : sources) {
    if (s.data == nullptr) throw InvalidArgument("reduce_tiles: null source tile");
  }
  for (const TileReduceLaunch& l : plan_tile_reduce(sources.size(), mode)) {
    const TileSource& first = sources[l.first];
    if (l.count == 1 && first.dtype == TileDType::f32) {  // one fp32 source: copy, or one add
      const auto* src = static_cast<const float*>(first.data);
      if (l.assign) {
        std::memcpy(accumulator, src, static_cast<size_t>(count) * sizeof(float));
      } else {
        add_into(accumulator, src, count);
      }
      continue;
    }
    for (int64_t i = 0; i < count; ++i) {
      float acc = l.assign
                      ? widen(sources[l.first].data, sources[l.first].dtype, i)
                      : accumulator[i] + widen(sources[l.first].data, sources[l.first].dtype, i);
      for (size_t j = l.first + 1; j < l.first + l.count; ++j) {
        acc = acc + widen(sources[j].data, sources[j].dtype, i);
      }
      accumulator[i] = acc;
    }
  }
}

}  // namespace muon
