// CUDA backend: Newton-Schulz on cuBLAS for a batch of same-shape wide matrices.
//
// Per call (Backend::newton_schulz_batch): copy the batch to the device, normalize every matrix by
// its own Frobenius norm (small deterministic reduction kernels), run the steps
//   A = X X^T,  B = b A + c A A,  X <- a X + B X
// (Jordan et al. 2024, "Muon"; coefficients from kernels/ns_schedule.hpp) as strided-batched
// GEMMs over the whole batch, convert back to fp32 and copy back. Device buffers, the stream and
// the cuBLAS handle are created once and reused; buffers only grow.
//
// Precision::fp32: fp32 storage, fp32 products without TF32 or any emulation
// (CUBLAS_COMPUTE_32F_PEDANTIC). Precision::bf16 (this backend's default): X, A and B are stored
// in bf16 after normalization and every product accumulates in fp32 (CUBLAS_COMPUTE_32F), like the
// torch reference that runs the same loop on bf16 tensors.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/cuda_backend.hpp"
#include "kernels/elementwise.hpp"

namespace muon {
namespace {

constexpr int kThreads = 256;                  // block size of every kernel here (a power of two)
constexpr int64_t kMaxBlocksPerMatrix = 1024;  // blocks per matrix of a per-matrix launch
constexpr int64_t kNormElementsPerThread = 16;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 20;

// ---- device code ---------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Sum of `v` over the block, in a fixed tree order (deterministic). `shared` holds kThreads values;
// every thread of the block must call it.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width >>= 1) {
    if (static_cast<int>(threadIdx.x) < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // `shared` is reused by the caller's next matrix
  return total;
}

// First pass of the Frobenius norms: partials[mat][part] = sum of x^2 over the elements
// part*kThreads + t + k*gridDim.x*kThreads of matrix `mat`, accumulated in double. Grid:
// (parts, min(count, 65535)); no atomics, so the result depends on the launch shape only.
__global__ void __launch_bounds__(kThreads)
    sum_squares_partial(const float* __restrict__ x, int64_t count, int64_t size,
                        double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  const int64_t parts = gridDim.x;
  const int64_t stride = parts * kThreads;
  for (int64_t mat = blockIdx.y; mat < count; mat += gridDim.y) {
    const float* xm = x + mat * size;
    double s = 0.0;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < size;
         i += stride) {
      const double v = xm[i];
      s += v * v;
    }
    const double total = block_sum(s, shared);
    if (threadIdx.x == 0) partials[mat * parts + blockIdx.x] = total;
  }
}

// Second pass: denom[mat] = the divisor of matrix `mat` per the eps mode (add: ||X|| + eps,
// clamp: max(||X||, eps), both in fp32 like the CPU backend), or 0 when the matrix is all zeros
// (then normalize() writes zeros instead of dividing). A nonzero matrix always gets denom > 0:
// float(||X||) >= max|x_ij| > 0.
__global__ void __launch_bounds__(kThreads)
    finish_denominators(const double* __restrict__ partials, int64_t count, int64_t parts,
                        float eps, bool clamp, float* __restrict__ denom) {
  __shared__ double shared[kThreads];
  for (int64_t mat = blockIdx.x; mat < count; mat += gridDim.x) {
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < parts; i += kThreads) s += partials[mat * parts + i];
    const double total = block_sum(s, shared);
    if (threadIdx.x == 0) {
      const double norm = sqrt(total);
      const float fnorm = static_cast<float>(norm);
      denom[mat] = norm == 0.0 ? 0.0f : (clamp ? fmaxf(fnorm, eps) : fnorm + eps);
    }
  }
}

// out = x / denom per matrix, rounded to T (exact zeros for an all-zero matrix). `out` may alias
// `x` when T is float. Grid: (blocks per matrix, min(count, 65535)).
template <class T>
__global__ void __launch_bounds__(kThreads) normalize(const float* x, int64_t count, int64_t size,
                                                      const float* __restrict__ denom, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t mat = blockIdx.y; mat < count; mat += gridDim.y) {
    const float d = denom[mat];
    const float* xm = x + mat * size;
    T* om = out + mat * size;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < size;
         i += stride) {
      om[i] = from_float<T>(d == 0.0f ? 0.0f : xm[i] / d);
    }
  }
}

// dst = float(src) for n elements; sets *nonfinite to 1 when any value is NaN or Inf
// (is_finite_bits from kernels/elementwise.hpp, the same test the host runs on the input).
// `dst` may alias `src` when T is float.
template <class T>
__global__ void __launch_bounds__(kThreads)
    to_fp32_checked(const T* src, int64_t n, float* dst, int* __restrict__ nonfinite) {
  int bad = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float v = to_float(src[i]);
    bad |= is_finite_bits(v) ? 0 : 1;
    dst[i] = v;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1);  // an int flag
}

// ---- host-side RAII ------------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/// A device allocation that only grows; contents are not kept across growth.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) MUON_CUDA_CHECK_NOTHROW(cudaFree(ptr_));
  }

  /// Makes room for `bytes`. Throws DeviceError (e.g. out of memory).
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_ != nullptr) {
      void* old = std::exchange(ptr_, nullptr);
      bytes_ = 0;
      MUON_CUDA_CHECK(cudaFree(old));  // synchronizes: no queued work still uses it
    }
    MUON_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// The backend's one stream (non-blocking: never serialized with the legacy default stream).
class Stream {
 public:
  Stream() { MUON_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { MUON_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_)); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// The backend's cuBLAS handle, bound to `stream`. Math mode: default (no TF32 unless asked for,
/// and the fp32 path asks for the pedantic compute type anyway) and reductions in the accumulator
/// type, never in bf16.
class BlasHandle {
 public:
  explicit BlasHandle(cudaStream_t stream) {
    MUON_CUBLAS_CHECK(cublasCreate(&handle_));
    try {
      MUON_CUBLAS_CHECK(cublasSetStream(handle_, stream));
      MUON_CUBLAS_CHECK(cublasSetMathMode(
          handle_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    } catch (...) {
      MUON_CUBLAS_CHECK_NOTHROW(cublasDestroy(handle_));
      throw;
    }
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  ~BlasHandle() { MUON_CUBLAS_CHECK_NOTHROW(cublasDestroy(handle_)); }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Selects the device before the members below are created.
struct DeviceSelector {
  explicit DeviceSelector(int device) { MUON_CUDA_CHECK(cudaSetDevice(device)); }
};

// ---- the backend ---------------------------------------------------------------------------

/// Newton-Schulz with cuBLAS on one GPU. Inputs and outputs are host fp32 (Backend's contract);
/// the batch is computed in Precision::bf16 (default) or fp32. NsAlgorithm::syrk and ::gram run
/// as plain GEMMs here: cuBLAS has no bf16 SYRK and no strided-batched SYRK, and all three compute
/// the same polynomial (kernels/muon_options.hpp), so results match the CPU's plain path.
/// Deterministic on a given GPU and cuBLAS version: no float atomics, fixed launch shapes.
/// Not thread-safe (one backend per worker thread); any thread may call it.
class CudaBackend final : public Backend {
 public:
  /// Selects config.cuda_device and creates the stream and the cuBLAS handle.
  /// Throws DeviceError when any of that fails (make_cuda_backend turns it into
  /// BackendUnavailable).
  explicit CudaBackend(const BackendConfig& config)
      : device_(config.cuda_device), selector_(device_), stream_(), blas_(stream_.get()) {}

  ~CudaBackend() override {
    // Finish queued work before members are released in reverse order: buffers, then the cuBLAS
    // handle, then the stream.
    MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(device_));
    MUON_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_.get()));
  }

  std::string_view name() const override { return "cuda"; }
  Precision default_precision() const override { return Precision::bf16; }

 protected:
  void newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                           const std::vector<NsCoefficients>& coefficients,
                           const OrthogonalizeOptions& options) override {
    if (count <= 0 || rows <= 0 || cols <= 0) return;
    if (rows > cols) {
      throw InvalidArgument("newton_schulz_batch needs wide matrices (rows <= cols), got " +
                            std::to_string(rows) + "x" + std::to_string(cols));
    }
    if (cols > INT_MAX || count > INT_MAX) {
      throw InvalidArgument("matrix batch " + std::to_string(count) + "x" + std::to_string(rows) +
                            "x" + std::to_string(cols) + " exceeds cuBLAS' 32-bit dimensions");
    }
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const Precision precision =
        options.precision == Precision::backend_default ? default_precision() : options.precision;
    if (precision == Precision::bf16) {
      run<__nv_bfloat16>(x, count, rows, cols, coefficients, options);
    } else {
      run<float>(x, count, rows, cols, coefficients, options);
    }
  }

 private:
  // C[i] = alpha * op(A[i]) op(B[i]) + beta * C[i] for i < batch, column-major (cuBLAS').
  void gemm(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
            float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
            int64_t stride_b, float beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
            cudaDataType_t type, cublasComputeType_t compute) {
    MUON_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_.get(), op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
        &alpha, a, type, static_cast<int>(lda), stride_a, b, type, static_cast<int>(ldb), stride_b,
        &beta, c, type, static_cast<int>(ldc), stride_c, static_cast<int>(batch), compute,
        CUBLAS_GEMM_DEFAULT));
  }

  // The whole pipeline with X, A, B stored as T (float or bf16).
  template <class T>
  void run(float* x, int64_t count, int64_t m, int64_t n,
           const std::vector<NsCoefficients>& coefficients, const OrthogonalizeOptions& options) {
    constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
    const cudaDataType_t type = kBf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = kBf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    const cudaStream_t stream = stream_.get();
    const int64_t size = m * n, total = count * size, gram = m * m;
    const int64_t parts = std::clamp<int64_t>(ceil_div(size, kThreads * kNormElementsPerThread), 1,
                                              kMaxBlocksPerMatrix);

    input_.reserve(sizeof(float) * total);
    if constexpr (kBf16) x0_.reserve(sizeof(T) * total);
    x1_.reserve(sizeof(T) * total);
    a_.reserve(sizeof(T) * count * gram);
    b_.reserve(sizeof(T) * count * gram);
    partials_.reserve(sizeof(double) * count * parts);
    denom_.reserve(sizeof(float) * count);
    flag_.reserve(sizeof(int));

    float* in = input_.as<float>();
    T* cur = kBf16 ? x0_.as<T>() : reinterpret_cast<T*>(in);  // fp32: normalize in place
    T* next = x1_.as<T>();
    T* A = a_.as<T>();
    T* B = b_.as<T>();

    MUON_CUDA_CHECK(cudaMemcpyAsync(in, x, sizeof(float) * total, cudaMemcpyHostToDevice, stream));

    // X <- X / denom, per matrix.
    const dim3 per_matrix_grid(static_cast<unsigned>(parts),
                               static_cast<unsigned>(std::min(count, kMaxGridY)));
    sum_squares_partial<<<per_matrix_grid, kThreads, 0, stream>>>(in, count, size,
                                                                  partials_.as<double>());
    MUON_CUDA_CHECK(cudaGetLastError());
    finish_denominators<<<static_cast<unsigned>(std::min(count, kMaxGridX)), kThreads, 0, stream>>>(
        partials_.as<double>(), count, parts, options.eps, options.eps_mode == EpsMode::clamp,
        denom_.as<float>());
    MUON_CUDA_CHECK(cudaGetLastError());
    const dim3 normalize_grid(static_cast<unsigned>(std::clamp<int64_t>(ceil_div(size, kThreads), 1,
                                                                        kMaxBlocksPerMatrix)),
                              static_cast<unsigned>(std::min(count, kMaxGridY)));
    normalize<T><<<normalize_grid, kThreads, 0, stream>>>(in, count, size, denom_.as<float>(), cur);
    MUON_CUDA_CHECK(cudaGetLastError());

    // Row-major X (m x n, ld n) is, read column-major, X^T (n x m, ld n); likewise a row-major
    // m x m matrix M is M^T column-major. With that:
    //   A = X X^T        column-major m x m:  (X^T)^T (X^T)    = gemm(T, N, m, m, n) on the X
    //   buffer B = b A + c A A  column-major B^T:    b A^T + c A^T A^T = gemm(N, N, m, m, m) on A's
    //   buffer X' = a X + B X   column-major X'^T:   a X^T + X^T B^T   = gemm(N, N, n, m, m) (X,
    //   then B)
    // so every buffer holds exactly the row-major matrix the CPU backend holds.
    for (const NsCoefficients& k : coefficients) {
      const float ka = static_cast<float>(k.a), kb = static_cast<float>(k.b),
                  kc = static_cast<float>(k.c);
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, m, m, n, 1.0f, cur, n, size, cur, n, size, 0.0f, A, m, gram,
           count, type, compute);
      MUON_CUDA_CHECK(
          cudaMemcpyAsync(B, A, sizeof(T) * count * gram, cudaMemcpyDeviceToDevice, stream));
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, kc, A, m, gram, A, m, gram, kb, B, m, gram, count,
           type, compute);
      MUON_CUDA_CHECK(
          cudaMemcpyAsync(next, cur, sizeof(T) * total, cudaMemcpyDeviceToDevice, stream));
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, n, m, m, 1.0f, cur, n, size, B, m, gram, ka, next, n, size,
           count, type, compute);
      std::swap(cur, next);
    }

    // Back to fp32 (in place when cur == in), checked, and home.
    int* flag = flag_.as<int>();
    MUON_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
    to_fp32_checked<T>
        <<<static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, kMaxGridX)),
           kThreads, 0, stream>>>(cur, total, in, flag);
    MUON_CUDA_CHECK(cudaGetLastError());
    MUON_CUDA_CHECK(cudaMemcpyAsync(x, in, sizeof(float) * total, cudaMemcpyDeviceToHost, stream));
    int nonfinite = 0;
    MUON_CUDA_CHECK(cudaMemcpyAsync(&nonfinite, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
    MUON_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (nonfinite != 0) {
      throw DeviceError("CUDA Newton-Schulz produced NaN/Inf from finite input (batch " +
                        std::to_string(count) + " of " + std::to_string(m) + "x" +
                        std::to_string(n) + ", " + (kBf16 ? "bf16" : "fp32") + ")");
    }
  }

  // Declaration order = construction order; destruction runs in reverse: buffers, handle, stream.
  int device_;
  DeviceSelector selector_;
  Stream stream_;
  BlasHandle blas_;
  DeviceBuffer input_;     // fp32 batch as copied in and out (fp32: also the X ping buffer)
  DeviceBuffer x0_, x1_;   // X ping/pong in T (x0_ unused for fp32)
  DeviceBuffer a_, b_;     // A and B per matrix, m x m in T
  DeviceBuffer partials_;  // norm partial sums, double [count][parts]
  DeviceBuffer denom_;     // per-matrix divisor, float [count]
  DeviceBuffer flag_;      // non-finite output flag, int
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config) {
  // Any failure up to a working cuBLAS handle means "no usable GPU here", not a crash: no driver,
  // "CUDA driver version is insufficient for CUDA runtime version", no device, a bad ordinal,
  // cublasCreate failing.
  try {
    int devices = 0;
    MUON_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices == 0) throw BackendUnavailable("no usable CUDA GPU: no CUDA device is visible");
    if (config.cuda_device < 0 || config.cuda_device >= devices) {
      throw BackendUnavailable("no usable CUDA GPU: device " + std::to_string(config.cuda_device) +
                               " requested, " + std::to_string(devices) + " visible");
    }
    return std::make_unique<CudaBackend>(config);
  } catch (const DeviceError& e) {
    throw BackendUnavailable("no usable CUDA GPU: " + e.message());
  }
}

}  // namespace muon
