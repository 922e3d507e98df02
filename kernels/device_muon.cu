// The device Muon step (see device_muon.hpp): finite check, momentum, gather/scatter of row
// blocks and the scale, around DeviceNewtonSchulz.
//
// This file is compiled with -fmad=false (kernels/CMakeLists.txt): nvcc would otherwise contract
// mu*m + g in momentum_step() into one FMA, whose single rounding differs from the host's
// multiply-then-add (GCC does not contract in ISO C++ mode), and the device momentum would no
// longer be bitwise the host's. Where torch fuses (lerp), elementwise.hpp calls fmaf itself.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_muon.hpp"
#include "kernels/device_newton_schulz.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/scale_rule.hpp"

namespace muon {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 1 << 20;
constexpr int64_t kMaxGridYZ = 65535;
constexpr int kTile = 32;     // transpose tile (32 x 32 floats, one padded column in shared memory)
constexpr int kTileRows = 8;  // threads per tile column: a block is kTile x kTileRows threads

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

unsigned grid_1d(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, kThreads), 1, kMaxGridX));
}

// *bad = 1 when any of x[0..n) is NaN or Inf (the host's is_finite_bits test).
__global__ void __launch_bounds__(kThreads)
    check_finite(const float* __restrict__ x, int64_t n, int* __restrict__ bad) {
  int found = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    found |= is_finite_bits(x[i]) ? 0 : 1;
  }
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicOr(bad, 1);
}

// Per element, exactly Backend::muon_update's loop: m = momentum_step(M, g); M = m;
// input = orthogonalize_input(m, g). Does nothing when *bad (momentum untouched).
__global__ void __launch_bounds__(kThreads)
    momentum_kernel(MomentumConvention conv, bool nesterov, MomentumCoefficients k,
                    const float* __restrict__ grad, float* __restrict__ momentum,
                    float* __restrict__ input, int64_t n, const int* __restrict__ bad) {
  if (*bad != 0) return;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float g = grad[i];
    const float m = momentum_step(conv, momentum[i], g, k);
    momentum[i] = m;
    input[i] = orthogonalize_input(conv, nesterov, m, g, k);
  }
}

// dst[b][i] = factor * src[b][i] for i < block and every slice b (zeros when zero && *zero).
// `dst` may equal `src`. Grid: (x, min(batch, 65535)).
__global__ void __launch_bounds__(kThreads)
    copy_scaled(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t block,
                int64_t batch, float factor, const int* __restrict__ zero) {
  const bool zeros = zero != nullptr && *zero != 0;
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const float* s = src + b * src_stride;
    float* d = dst + b * dst_stride;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < block;
         i += static_cast<int64_t>(gridDim.x) * kThreads) {
      d[i] = zeros ? 0.0f : factor * s[i];
    }
  }
}

// dst[b] (cols x rows, row-major) = factor * src[b]^T (src[b]: rows x cols, row-major), the
// host's transpose_scaled per slice, through 32 x 32 shared-memory tiles so that both reads and
// writes are coalesced (zeros when zero && *zero). Grid: (col tiles, row tiles, slices), each
// dimension grid-strided; block: kTile x kTileRows.
__global__ void __launch_bounds__(kTile* kTileRows)
    transpose_scaled(const float* __restrict__ src, int64_t src_stride, int64_t rows, int64_t cols,
                     int64_t batch, float* __restrict__ dst, int64_t dst_stride, float factor,
                     const int* __restrict__ zero) {
  __shared__ float tile[kTile][kTile + 1];
  const bool zeros = zero != nullptr && *zero != 0;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const float* s = src + b * src_stride;
    float* d = dst + b * dst_stride;
    for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows;
         r0 += static_cast<int64_t>(gridDim.y) * kTile) {
      for (int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile; c0 < cols;
           c0 += static_cast<int64_t>(gridDim.x) * kTile) {
        for (int k = threadIdx.y; k < kTile; k += kTileRows) {
          const int64_t r = r0 + k, c = c0 + threadIdx.x;
          if (r < rows && c < cols) tile[k][threadIdx.x] = s[r * cols + c];
        }
        __syncthreads();
        for (int k = threadIdx.y; k < kTile; k += kTileRows) {
          const int64_t c = c0 + k, r = r0 + threadIdx.x;
          if (r < rows && c < cols) d[c * rows + r] = zeros ? 0.0f : factor * tile[threadIdx.x][k];
        }
        __syncthreads();
      }
    }
  }
}

// *status |= kDeviceInputNonFinite when the input was bad, else kDeviceOutputNonFinite when NS
// produced NaN/Inf.
__global__ void fold_status(const int* __restrict__ input_bad, const int* __restrict__ ns_bad,
                            int* __restrict__ status) {
  const int bits =
      *input_bad != 0 ? kDeviceInputNonFinite : (*ns_bad != 0 ? kDeviceOutputNonFinite : 0);
  if (bits != 0) atomicOr(status, bits);
}

void launch_copy_scaled(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                        int64_t block, int64_t batch, float factor, const int* zero,
                        cudaStream_t stream) {
  const dim3 grid(grid_1d(block), static_cast<unsigned>(std::min(batch, kMaxGridYZ)));
  copy_scaled<<<grid, kThreads, 0, stream>>>(src, src_stride, dst, dst_stride, block, batch, factor,
                                             zero);
  MUON_CUDA_CHECK(cudaGetLastError());
}

void launch_transpose_scaled(const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                             int64_t batch, float* dst, int64_t dst_stride, float factor,
                             const int* zero, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(std::min(ceil_div(cols, kTile), kMaxGridX)),
                  static_cast<unsigned>(std::min(ceil_div(rows, kTile), kMaxGridYZ)),
                  static_cast<unsigned>(std::min(batch, kMaxGridYZ)));
  transpose_scaled<<<grid, dim3(kTile, kTileRows), 0, stream>>>(src, src_stride, rows, cols, batch,
                                                                dst, dst_stride, factor, zero);
  MUON_CUDA_CHECK(cudaGetLastError());
}

// Selects the device before the members below are created.
struct DeviceSelector {
  explicit DeviceSelector(int device) { MUON_CUDA_CHECK(cudaSetDevice(device)); }
};

}  // namespace

struct DeviceMuon::Impl {
  explicit Impl(const DeviceMuonConfig& config)
      : device(config.device), selector(config.device), ns(config.capture_graphs) {
    flags.reserve(2 * sizeof(int));
  }

  int* input_bad() const { return flags.as<int>(); }
  int* ns_bad() const { return flags.as<int>() + 1; }

  // Zeroes the flags and checks `in` (n elements) for NaN/Inf.
  void begin(const float* in, int64_t n, cudaStream_t stream) {
    MUON_CUDA_CHECK(cudaMemsetAsync(flags.get(), 0, 2 * sizeof(int), stream));
    check_finite<<<grid_1d(n), kThreads, 0, stream>>>(in, n, input_bad());
    MUON_CUDA_CHECK(cudaGetLastError());
  }

  void finish(int* status, cudaStream_t stream) {
    if (status == nullptr) return;
    fold_status<<<1, 1, 0, stream>>>(input_bad(), ns_bad(), status);
    MUON_CUDA_CHECK(cudaGetLastError());
  }

  // Backend::orthogonalize's gather / newton_schulz_batch / scale-and-scatter, per row block, on
  // the device. The update is zeroed when input_bad() is set.
  void orthogonalize(std::string_view name, const MatrixShape& shape, const float* in, float* out,
                     const OrthogonalizeOptions& options, cudaStream_t stream) {
    const auto coefficients = ns_coefficients(options);
    const auto blocks = row_blocks(options, shape, name);
    const Precision precision =
        options.precision == Precision::backend_default ? Precision::bf16 : options.precision;
    const int64_t c = shape.cols, slice = shape.rows * shape.cols, batch = shape.batch;
    auto factor_of = [&](int64_t rb) {
      return static_cast<float>(options.extra_scale * scale_factor(options.scale_rule, rb, c));
    };
    if (blocks.size() == 1 && shape.rows <= c && in == out) {
      // One wide block computed in place: no gather or scatter (the same bits, two copies fewer).
      ns.run(out, batch, shape.rows, c, coefficients, options, precision, stream, ns_bad());
      launch_copy_scaled(out, slice, out, slice, slice, batch, factor_of(shape.rows), input_bad(),
                         stream);
      return;
    }
    const int64_t largest = *std::max_element(blocks.begin(), blocks.end());
    work.reserve(sizeof(float) * static_cast<size_t>(batch * largest * c));
    float* w = work.as<float>();
    int64_t row0 = 0;
    for (int64_t rb : blocks) {
      // Wide orientation: tall blocks are transposed so the Gram matrix is min(rb, c) square.
      const bool tall = rb > c;
      const int64_t m = tall ? c : rb, k = tall ? rb : c, block = rb * c;
      const float* src = in + row0 * c;
      float* dst = out + row0 * c;
      if (tall) {
        launch_transpose_scaled(src, slice, rb, c, batch, w, block, 1.0f, nullptr, stream);
      } else {
        launch_copy_scaled(src, slice, w, block, block, batch, 1.0f, nullptr, stream);
      }
      ns.run(w, batch, m, k, coefficients, options, precision, stream, ns_bad());
      if (tall) {
        launch_transpose_scaled(w, block, c, rb, batch, dst, slice, factor_of(rb), input_bad(),
                                stream);
      } else {
        launch_copy_scaled(w, block, dst, slice, block, batch, factor_of(rb), input_bad(), stream);
      }
      row0 += rb;
    }
  }

  // Declaration order = construction order; destruction runs in reverse.
  int device;
  DeviceSelector selector;
  DeviceNewtonSchulz ns;
  DeviceBuffer work;   // gathered row blocks in wide orientation, fp32 [batch][block]
  DeviceBuffer flags;  // int [2]: input not finite, NS output not finite
};

DeviceMuon::DeviceMuon(const DeviceMuonConfig& config) {
  // As make_cuda_backend: any failure up to a working cuBLAS handle means "no usable GPU here".
  try {
    int devices = 0;
    MUON_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (config.device < 0 || config.device >= devices) {
      throw BackendUnavailable("no usable CUDA GPU: device " + std::to_string(config.device) +
                               " requested, " + std::to_string(devices) + " visible");
    }
    impl_ = std::make_unique<Impl>(config);
  } catch (const DeviceError& e) {
    throw BackendUnavailable("no usable CUDA GPU: " + e.message());
  }
}

DeviceMuon::~DeviceMuon() = default;

void DeviceMuon::step(std::string_view matrix_name, const MatrixShape& shape, const float* grad,
                      float* momentum, float* update, const MuonOptions& options,
                      StreamHandle stream, int* status) {
  validate(options, shape, matrix_name);
  const auto& mo = options.momentum;
  if (mo.convention == MomentumConvention::none) {
    orthogonalize(matrix_name, shape, grad, update, options.orthogonalize, stream, status);
    return;
  }
  if (momentum == nullptr) {
    throw InvalidArgument("matrix '" + std::string(matrix_name) +
                          "': momentum buffer is null but the convention keeps momentum");
  }
  MUON_CUDA_CHECK(cudaSetDevice(impl_->device));
  const int64_t n = shape.numel();
  impl_->begin(grad, n, stream);
  momentum_kernel<<<grid_1d(n), kThreads, 0, stream>>>(mo.convention, mo.nesterov,
                                                       momentum_coefficients(mo.mu), grad,
                                                       momentum, update, n, impl_->input_bad());
  MUON_CUDA_CHECK(cudaGetLastError());
  // As the host (Backend::orthogonalize checks its input): a Newton-Schulz input that overflowed
  // in the momentum step (finite gradient, huge momentum) is non-finite input, not divergence.
  check_finite<<<grid_1d(n), kThreads, 0, stream>>>(update, n, impl_->input_bad());
  MUON_CUDA_CHECK(cudaGetLastError());
  impl_->orthogonalize(matrix_name, shape, update, update, options.orthogonalize, stream);
  impl_->finish(status, stream);
}

void DeviceMuon::orthogonalize(std::string_view matrix_name, const MatrixShape& shape,
                               const float* in, float* out, const OrthogonalizeOptions& options,
                               StreamHandle stream, int* status) {
  validate(options, shape, matrix_name);
  MUON_CUDA_CHECK(cudaSetDevice(impl_->device));
  impl_->begin(in, shape.numel(), stream);
  impl_->orthogonalize(matrix_name, shape, in, out, options, stream);
  impl_->finish(status, stream);
}

size_t DeviceMuon::captured_graphs() const {
  return impl_->ns.captured_graphs();
}

}  // namespace muon
