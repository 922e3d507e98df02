// The contributor-order tile reduction, on the host and on the device. The server sums each
// element's contributions in ascending rank order, never arrival order (daemon/step_reducer.hpp):
//   acc = c_0;  acc = acc + c_1;  ...;  acc = acc + c_{k-1}
// which is bitwise StepReducer::reduce (its -0.0f start plus c_0 is c_0, bit for bit). bf16
// contributions are widened exactly to fp32 first (kernels/bf16.hpp's bf16_to_f32). Both
// versions walk the sources in the same launches (plan_tile_reduce), so they agree bitwise.
// The header names no CUDA type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/device_stream.hpp"
#include "kernels/dtype.hpp"

namespace muon {

/// The element type of a contribution tile was once its own enum; daemon/ code still names it
/// so until the core re-cut (issue 15) replaces the name with DType.
using TileDType = DType;

/// One contributor's tile: `count` elements (the caller's count) of `dtype` at `data`
/// (device memory for reduce_tiles, host memory for reduce_tiles_host).
struct TileSource {
  const void* data = nullptr;
  DType dtype = DType::f32;
};

/// assign: the accumulator becomes c_0 + c_1 + ... (its old contents are ignored).
/// accumulate: it becomes acc + c_0 + c_1 + ... (continues a reduction whose earlier ranks were
/// already summed, e.g. when contributors arrive in rank order across several calls).
enum class TileReduce { assign, accumulate };

/// Most sources one device launch reads; more are reduced in several launches, in order.
inline constexpr size_t kMaxTilesPerLaunch = 8;

/// One launch of a reduction: sources [first, first + count), the first of them copied
/// (assign) or added to the accumulator.
struct TileReduceLaunch {
  size_t first = 0;
  size_t count = 0;
  bool assign = false;
};

/// The launches that reduce `sources` sources in order: chunks of kMaxTilesPerLaunch, the first
/// assigning when mode is assign, every later one accumulating. Empty for 0 sources.
std::vector<TileReduceLaunch> plan_tile_reduce(size_t sources, TileReduce mode);

/// Host version (the reference of the device one): accumulator[0..count) per `mode` from the
/// host tiles `sources`, in their order. Throws InvalidArgument for no sources with assign, a
/// null pointer, or a negative count.
void reduce_tiles_host(std::span<const TileSource> sources, float* accumulator, int64_t count,
                       TileReduce mode);

/// Device version: the same sums with __fadd_rn (never contracted), enqueued on `stream`
/// (accumulator and sources: device memory; the accumulator must not overlap a source).
/// Returns without waiting. Throws InvalidArgument as reduce_tiles_host, DeviceError when a
/// launch fails. Defined only in CUDA builds (muon_kernels_cuda).
void reduce_tiles(std::span<const TileSource> sources, float* accumulator, int64_t count,
                  TileReduce mode, StreamHandle stream);

}  // namespace muon
