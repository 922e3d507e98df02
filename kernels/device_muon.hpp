// The Muon step on device-resident buffers, enqueued on a caller's stream: what a server that
// keeps gradients, momentum and updates in GPU memory runs (no host round trip). The same math as
// Backend::muon_update (kernels/backend.hpp), step for step:
//   momentum  M <- momentum_step(M, G), input <- orthogonalize_input(M, G) per element with the
//             __host__ __device__ functions of kernels/elementwise.hpp, compiled without FMA
//             contraction (-fmad=false), so the momentum is bitwise the host's;
//   per row block: gather (tall blocks transposed to wide), DeviceNewtonSchulz, then
//             U = float(extra_scale * scale_rule(rows_block, cols)) * NS, transposed back.
// The header names no CUDA type: pointers are device pointers, streams StreamHandle.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "kernels/device_stream.hpp"
#include "kernels/muon_options.hpp"

namespace muon {

/// Bits a device step ORs into the caller's status word.
inline constexpr int kDeviceInputNonFinite = 1;   ///< gradient/input held NaN or Inf
inline constexpr int kDeviceOutputNonFinite = 2;  ///< NS produced NaN or Inf from finite input

/// Start-up settings of DeviceMuon.
struct DeviceMuonConfig {
  int device = 0;               ///< CUDA device ordinal
  bool capture_graphs = false;  ///< capture each (shape, options) NS sequence once, then replay
};

/// Muon math on device pointers. Every call validates its options on the host (throwing before
/// anything is enqueued), enqueues its work on `stream` and returns without waiting; results are
/// ready when the stream reaches that point.
///
/// Non-finite input is handled on the device, without a host round trip: the update is all
/// zeros and kDeviceInputNonFinite is ORed into *status. A non-finite gradient leaves the momentum
/// untouched; a finite gradient whose momentum step overflowed (the Newton-Schulz input is not
/// finite, as the host's Backend::orthogonalize checks it) leaves the momentum stepped, as the
/// host's muon_update does (the caller restores it when it refuses the step). The
/// caller applies its NonFinitePolicy when it reads the status (error: raise NonFiniteError
/// naming the matrix; skip: keep the zero update). kDeviceOutputNonFinite means Newton-Schulz
/// diverged on finite input (a bf16 overflow): the CUDA backend's host API raises DeviceError
/// for it.
///
/// Not thread-safe; calls on different streams must be ordered by the caller (the workspace is
/// shared). Buffers only grow; they are released with the object.
class DeviceMuon {
 public:
  /// Selects config.device and creates the cuBLAS handle and workspaces. Throws
  /// BackendUnavailable when no usable GPU is present (the message says why).
  explicit DeviceMuon(const DeviceMuonConfig& config = {});
  ~DeviceMuon();
  DeviceMuon(const DeviceMuon&) = delete;
  DeviceMuon& operator=(const DeviceMuon&) = delete;

  /// Precision::backend_default resolves to bf16, as in the CUDA backend.
  Precision default_precision() const { return Precision::bf16; }

  /// One Muon step, as Backend::muon_update: momentum <- momentum_step(momentum, grad), update
  /// <- U of the (Nesterov) input. With convention `none` the gradient is orthogonalized as it is
  /// and `momentum` may be null.
  ///   grad, momentum, update: device fp32, shape.numel() elements each, not aliasing.
  ///   status: null, or a device int the call ORs kDevice* bits into (the caller zeroes it).
  /// Throws InvalidArgument (shape/options, naming `matrix_name`), DeviceError.
  void step(std::string_view matrix_name, const MatrixShape& shape, const float* grad,
            float* momentum, float* update, const MuonOptions& options, StreamHandle stream,
            int* status = nullptr);

  /// U = extra_scale * scale_rule(block) * NS(X) for every matrix and row block, as
  /// Backend::orthogonalize; `in` and `out` are device fp32 and may be equal.
  void orthogonalize(std::string_view matrix_name, const MatrixShape& shape, const float* in,
                     float* out, const OrthogonalizeOptions& options, StreamHandle stream,
                     int* status = nullptr);

  /// Graphs captured so far (0 without capture_graphs).
  size_t captured_graphs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon
