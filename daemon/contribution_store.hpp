// Where a StepReducer keeps each contributing rank's packed fp32 contribution of a step, and the
// few element moves the reduction needs. Two implementations with the same arithmetic: host
// memory (make_host_contribution_store, every test on the CPU) and device memory of the
// server's GPU (DevicePlane::make_contribution_store, daemon/device_plane.hpp), whose moves are
// kernels/tile_reduce.hpp's reduce_tiles with __fadd_rn: one add per element per move, in the
// order the reducer issues them, so both give bitwise the same sums.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/device_stream.hpp"
#include "kernels/tile_reduce.hpp"

namespace muon::daemon {

/// `count` elements of `dtype` at `data`: in host memory, or (device = true) in device memory of
/// the server's GPU (a session's receive slot), readable by work queued on `stream` (the
/// session's receive stream; null: by any work, e.g. a buffer already written).
struct Contribution {
  const void* data = nullptr;
  TileDType dtype = TileDType::f32;
  bool device = false;
  int64_t count = 0;
  StreamHandle stream = nullptr;
};

/// One parameter's per-rank buffers. `out` pointers of fill/read are in the store's memory (host
/// for the host store, device for the device store). Not thread-safe (the server's io thread).
class ContributionStore {
 public:
  virtual ~ContributionStore() = default;

  /// Gives rank `rank` a buffer of `elements` fp32 values; kept across steps (contents
  /// unspecified until written). Throws DeviceError when device memory runs out.
  virtual void resize(size_t rank, int64_t elements) = 0;

  /// buffer[rank][at + i] = v[first + i] (add = false) or buffer[rank][at + i] += v[first + i]
  /// (add = true), i in [0, n), v widened exactly to fp32. The caller keeps [first, first + n)
  /// inside values.count and [at, at + n) inside the buffer. Throws InvalidArgument for a
  /// source the store cannot read (device data in the host store).
  virtual void write(size_t rank, int64_t at, const Contribution& values, int64_t first, int64_t n,
                     bool add) = 0;

  /// out[i] = -0.0f, i in [0, n): the start of a sum (-0 + v == v bitwise for every v).
  virtual void fill_negative_zero(float* out, int64_t n) = 0;

  /// out[i] = buffer[rank][at + i] (add = false) or out[i] += buffer[rank][at + i], i in [0, n).
  virtual void read(size_t rank, int64_t at, float* out, int64_t n, bool add) = 0;
};

/// Buffers in host memory (std::vector per rank); every move is reduce_tiles_host, the reference
/// the device kernels are tested against.
std::unique_ptr<ContributionStore> make_host_contribution_store();

}  // namespace muon::daemon
