// Newton-Schulz on device pointers (see device_newton_schulz.hpp): normalization kernels, the
// cuBLAS strided-batched GEMM steps, the checked conversion back to fp32, and the optional CUDA
// graph of the whole sequence per shape and options.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_sync_guard.hpp"
#include "kernels/device_newton_schulz.hpp"
#include "kernels/elementwise.hpp"

namespace muon {
namespace {

constexpr int kThreads = 256;                  // block size of every kernel here (a power of two)
constexpr int64_t kMaxBlocksPerMatrix = 1024;  // blocks per matrix of a per-matrix launch
constexpr int64_t kNormElementsPerThread = 16;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 20;
// cuBLAS workspace owned by the handle: what NVIDIA recommends for Hopper (32 MiB); a user
// workspace also keeps graph capture free of allocations and results independent of the stream.
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

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

// Second pass: denom[mat] = the divisor of matrix `mat` per the eps mode, as the CPU backend's
// normalization_divisor() (scale_invariant: ||X|| in double; add: float(||X||) + eps; clamp:
// max(float(||X||), eps)), or 0 when the matrix is all zeros (then normalize() writes zeros
// instead of dividing). A nonzero matrix always gets denom > 0: ||X|| >= max|x_ij| > 0.
__global__ void __launch_bounds__(kThreads)
    finish_denominators(const double* __restrict__ partials, int64_t count, int64_t parts,
                        float eps, EpsMode mode, double* __restrict__ denom) {
  __shared__ double shared[kThreads];
  for (int64_t mat = blockIdx.x; mat < count; mat += gridDim.x) {
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < parts; i += kThreads) s += partials[mat * parts + i];
    const double total = block_sum(s, shared);
    if (threadIdx.x == 0) {
      denom[mat] = normalization_divisor(sqrt(total), eps, mode);
    }
  }
}

// out = x / denom per matrix, divided in double and rounded once to float, then to T (exact
// zeros for an all-zero matrix; for a float divisor this is bitwise the float division). `out`
// may alias `x` when T is float. Grid: (blocks per matrix, min(count, 65535)).
template <class T>
__global__ void __launch_bounds__(kThreads) normalize(const float* x, int64_t count, int64_t size,
                                                      const double* __restrict__ denom, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t mat = blockIdx.y; mat < count; mat += gridDim.y) {
    const double d = denom[mat];
    const float* xm = x + mat * size;
    T* om = out + mat * size;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < size;
         i += stride) {
      om[i] = from_float<T>(d == 0.0 ? 0.0f : static_cast<float>(xm[i] / d));
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

// M[mat] += a I for `count` row-major m x m matrices (the a I of the gram step's P = a I + bR +
// cR^2). Grid: (blocks over the diagonal, min(count, 65535)).
template <class T>
__global__ void __launch_bounds__(kThreads)
    add_to_diagonal(T* __restrict__ mats, int64_t count, int64_t m, float a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t mat = blockIdx.y; mat < count; mat += gridDim.y) {
    T* mm = mats + mat * m * m;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < m;
         i += stride) {
      mm[i * m + i] = from_float<T>(to_float(mm[i * m + i]) + a);
    }
  }
}

// *dst |= *src: hands a captured graph's flag to the caller's.
__global__ void or_flag(const int* __restrict__ src, int* __restrict__ dst) {
  if (*src != 0) atomicOr(dst, *src);
}

// ---- host side -----------------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/// A cuBLAS handle on the current device. Math mode: default (no TF32 unless asked for, and the
/// fp32 path asks for the pedantic compute type anyway) and reductions in the accumulator type,
/// never in bf16.
class BlasHandle {
 public:
  BlasHandle() {
    MUON_CUBLAS_CHECK(cublasCreate(&handle_));
    const cublasStatus_t st = cublasSetMathMode(
        handle_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (st != CUBLAS_STATUS_SUCCESS) {
      MUON_CUBLAS_CHECK_NOTHROW(cublasDestroy(handle_));
      MUON_CUBLAS_CHECK(st);
    }
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  ~BlasHandle() { MUON_CUBLAS_CHECK_NOTHROW(cublasDestroy(handle_)); }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// The buffers of one Newton-Schulz sequence (X itself is the caller's).
struct Workspace {
  DeviceBuffer x0, x1;    // X ping/pong in T (x0 unused for fp32: X is normalized in place)
  DeviceBuffer a, b;      // A and B per matrix, m x m in T (gram: R and P)
  DeviceBuffer q, t;      // gram only: Q and a scratch product per matrix, m x m in T
  DeviceBuffer partials;  // norm partial sums, double [count][parts]
  DeviceBuffer denom;     // per-matrix divisor, double [count]
};

int64_t norm_parts(int64_t size) {
  return std::clamp<int64_t>(ceil_div(size, kThreads * kNormElementsPerThread), 1,
                             kMaxBlocksPerMatrix);
}

template <class T>
void reserve(Workspace& ws, int64_t count, int64_t m, int64_t n, bool gram_space) {
  const auto total = static_cast<size_t>(count * m * n), gram = static_cast<size_t>(m * m);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) ws.x0.reserve(sizeof(T) * total);
  ws.x1.reserve(sizeof(T) * total);
  ws.a.reserve(sizeof(T) * count * gram);
  ws.b.reserve(sizeof(T) * count * gram);
  if (gram_space) {
    ws.q.reserve(sizeof(T) * count * gram);
    ws.t.reserve(sizeof(T) * count * gram);
  }
  ws.partials.reserve(sizeof(double) * count * norm_parts(m * n));
  ws.denom.reserve(sizeof(double) * count);
}

/// A captured sequence for one key, with the buffers it was captured on.
struct CapturedGraph {
  Workspace ws;
  DeviceBuffer io;    // X as the graph reads and writes it, fp32 [count][m][n]
  DeviceBuffer flag;  // the graph's non-finite flag, int (zeroed by the graph itself)
  cudaGraphExec_t exec = nullptr;
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec != nullptr) MUON_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(exec));
  }
};

/// What a captured graph depends on besides X's contents.
struct GraphKey {
  int64_t count, m, n;
  bool bf16;
  float eps;
  EpsMode eps_mode;
  std::vector<double> coefficients;  // a, b, c of every step
  int gram_restart;                  // -1: the plain GEMMs; else gram with this restart
  auto operator<=>(const GraphKey&) const = default;
};

// -1 when `options` run the plain GEMMs (plain, syrk: cuBLAS has no bf16 or batched SYRK),
// else gram's restart interval (0: never).
int gram_restart_of(const OrthogonalizeOptions& options) {
  return options.algorithm == NsAlgorithm::gram ? options.gram_restart : -1;
}

}  // namespace

struct DeviceNewtonSchulz::Impl {
  explicit Impl(bool capture) : capture_graphs(capture) {
    MUON_CUDA_CHECK(cudaGetDevice(&device));
    blas_workspace.reserve(kBlasWorkspaceBytes);
    if (capture) capture_stream = std::make_unique<DeviceStream>();
  }

  // Points cuBLAS at `stream`. cublasSetStream resets the workspace to cuBLAS' own pool, so the
  // user workspace is set again after it.
  void bind(cudaStream_t stream) {
    if (bound && stream == bound_stream) return;
    MUON_CUBLAS_CHECK(cublasSetStream(blas.get(), stream));
    MUON_CUBLAS_CHECK(cublasSetWorkspace(blas.get(), blas_workspace.get(), blas_workspace.bytes()));
    bound = true;
    bound_stream = stream;
  }

  // C[i] = alpha * op(A[i]) op(B[i]) + beta * C[i] for i < batch, column-major (cuBLAS').
  void gemm(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
            float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
            int64_t stride_b, float beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
            cudaDataType_t type, cublasComputeType_t compute) {
    MUON_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas.get(), op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
        &alpha, a, type, static_cast<int>(lda), stride_a, b, type, static_cast<int>(ldb), stride_b,
        &beta, c, type, static_cast<int>(ldc), stride_c, static_cast<int>(batch), compute,
        CUBLAS_GEMM_DEFAULT));
  }

  // The gram iteration (as CpuBackend::gram: Zhang, Amsel, Chen, Dao 2025) on the normalized X
  // in `cur` (ws.x0/x1 or x itself), in runs (gram_run_lengths: `restart` steps each, a lone
  // last step joining the run before it): per run
  // R = X X^T, then per step P = a I + b R + c R R, Q <- P Q (Q = P at the first), R <- P R P
  // (not after the last), and X <- Q X at the end of the run into `next`, swapped with `cur`
  // (as the plain steps ping-pong). Row-major products C = A B are gemm(N, N, B, A)
  // column-major.
  template <class T>
  void gram_steps(Workspace& ws, T*& cur, T*& next, int64_t count, int64_t m, int64_t n,
                  const std::vector<NsCoefficients>& coefficients, int restart,
                  cudaDataType_t type, cublasComputeType_t compute, cudaStream_t stream) {
    const int64_t size = m * n, gram = m * m;
    T* R = ws.a.as<T>();
    T* P = ws.b.as<T>();
    T* Q = ws.q.as<T>();
    T* S = ws.t.as<T>();
    const dim3 diagonal_grid(
        static_cast<unsigned>(std::clamp<int64_t>(ceil_div(m, kThreads), 1, kMaxBlocksPerMatrix)),
        static_cast<unsigned>(std::min(count, kMaxGridY)));
    size_t last = 0;
    for (const size_t len : gram_run_lengths(coefficients.size(), restart)) {
      const size_t first = last;
      last = first + len;
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, m, m, n, 1.0f, cur, n, size, cur, n, size, 0.0f, R, m, gram,
           count, type, compute);
      for (size_t s = first; s < last; ++s) {
        const float ka = static_cast<float>(coefficients[s].a),
                    kb = static_cast<float>(coefficients[s].b),
                    kc = static_cast<float>(coefficients[s].c);
        MUON_CUDA_CHECK(
            cudaMemcpyAsync(P, R, sizeof(T) * count * gram, cudaMemcpyDeviceToDevice, stream));
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, kc, R, m, gram, R, m, gram, kb, P, m, gram, count,
             type, compute);
        add_to_diagonal<T><<<diagonal_grid, kThreads, 0, stream>>>(P, count, m, ka);
        MUON_CUDA_CHECK(cudaGetLastError());
        if (s == first) {
          MUON_CUDA_CHECK(
              cudaMemcpyAsync(Q, P, sizeof(T) * count * gram, cudaMemcpyDeviceToDevice, stream));
        } else {  // S = P Q, then Q <- S
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, 1.0f, Q, m, gram, P, m, gram, 0.0f, S, m, gram,
               count, type, compute);
          std::swap(Q, S);
        }
        if (s + 1 < last) {  // S = P R, R <- S P
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, 1.0f, R, m, gram, P, m, gram, 0.0f, S, m, gram,
               count, type, compute);
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, 1.0f, P, m, gram, S, m, gram, 0.0f, R, m, gram,
               count, type, compute);
        }
      }
      // next = Q cur (row-major), then swap.
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, n, m, m, 1.0f, cur, n, size, Q, m, gram, 0.0f, next, n, size,
           count, type, compute);
      std::swap(cur, next);
    }
  }

  // The whole sequence on x (device fp32, in place) with X, A, B stored as T, enqueued on
  // `stream`; ORs into *flag when a result is not finite. Allocates only when `ws` is too small
  // (never during capture: capture() reserves first).
  template <class T>
  void enqueue(Workspace& ws, float* x, int64_t count, int64_t m, int64_t n,
               const std::vector<NsCoefficients>& coefficients, const OrthogonalizeOptions& options,
               cudaStream_t stream, int* flag) {
    constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
    const cudaDataType_t type = kBf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = kBf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    const int64_t size = m * n, total = count * size, gram = m * m;
    const int64_t parts = norm_parts(size);
    const int restart = gram_restart_of(options);
    reserve<T>(ws, count, m, n, restart >= 0);
    bind(stream);

    T* cur = kBf16 ? ws.x0.as<T>() : reinterpret_cast<T*>(x);  // fp32: normalize in place
    T* next = ws.x1.as<T>();
    T* A = ws.a.as<T>();
    T* B = ws.b.as<T>();

    // X <- X / denom, per matrix.
    const dim3 per_matrix_grid(static_cast<unsigned>(parts),
                               static_cast<unsigned>(std::min(count, kMaxGridY)));
    sum_squares_partial<<<per_matrix_grid, kThreads, 0, stream>>>(x, count, size,
                                                                  ws.partials.as<double>());
    MUON_CUDA_CHECK(cudaGetLastError());
    finish_denominators<<<static_cast<unsigned>(std::min(count, kMaxGridX)), kThreads, 0, stream>>>(
        ws.partials.as<double>(), count, parts, options.eps, options.eps_mode,
        ws.denom.as<double>());
    MUON_CUDA_CHECK(cudaGetLastError());
    const dim3 normalize_grid(static_cast<unsigned>(std::clamp<int64_t>(ceil_div(size, kThreads), 1,
                                                                        kMaxBlocksPerMatrix)),
                              static_cast<unsigned>(std::min(count, kMaxGridY)));
    normalize<T>
        <<<normalize_grid, kThreads, 0, stream>>>(x, count, size, ws.denom.as<double>(), cur);
    MUON_CUDA_CHECK(cudaGetLastError());

    // Row-major X (m x n, ld n) is, read column-major, X^T (n x m, ld n); likewise a row-major
    // m x m matrix M is M^T column-major. With that:
    //   A = X X^T         column-major m x m: (X^T)^T (X^T)       = gemm(T, N, m, m, n) on X
    //   B = b A + c A A   column-major B^T:   b A^T + c A^T A^T   = gemm(N, N, m, m, m) on A
    //   X' = a X + B X    column-major X'^T:  a X^T + X^T B^T     = gemm(N, N, n, m, m) (X, B)
    // so every buffer holds exactly the row-major matrix the CPU backend holds.
    if (restart >= 0) {
      gram_steps<T>(ws, cur, next, count, m, n, coefficients, restart, type, compute, stream);
    } else {
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
    }

    // Back to fp32 in x (in place when cur == x), checked.
    to_fp32_checked<T>
        <<<static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, kMaxGridX)),
           kThreads, 0, stream>>>(cur, total, x, flag);
    MUON_CUDA_CHECK(cudaGetLastError());
  }

  // Captures enqueue<T> for `key` on the capture stream into a graph with its own buffers.
  template <class T>
  std::unique_ptr<CapturedGraph> capture(const GraphKey& key,
                                         const std::vector<NsCoefficients>& coefficients,
                                         const OrthogonalizeOptions& options) {
    auto g = std::make_unique<CapturedGraph>();
    const int64_t total = key.count * key.m * key.n;
    g->io.reserve(sizeof(float) * total);
    g->flag.reserve(sizeof(int));
    reserve<T>(g->ws, key.count, key.m, key.n, key.gram_restart >= 0);
    const cudaStream_t cs = capture_stream->get();
    bind(cs);
    cudaGraph_t graph = nullptr;
    {
      // No other thread of the process may synchronize the device until the capture ends
      // (gpu-review F7). Everything it needs is reserved above, so nothing inside frees.
      const auto exclusive = capture_scope();
      MUON_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
      try {
        MUON_CUDA_CHECK(cudaMemsetAsync(g->flag.get(), 0, sizeof(int), cs));
        enqueue<T>(g->ws, g->io.as<float>(), key.count, key.m, key.n, coefficients, options, cs,
                   g->flag.as<int>());
      } catch (...) {
        // End the capture so the stream is usable again; the partial graph is dropped.
        if (cudaStreamEndCapture(cs, &graph) == cudaSuccess && graph != nullptr) {
          cudaGraphDestroy(graph);
        }
        cudaGetLastError();
        throw;
      }
      MUON_CUDA_CHECK(cudaStreamEndCapture(cs, &graph));
    }
    const cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
    MUON_CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph));  // the executable graph keeps what it needs
    MUON_CUDA_CHECK(err);
    return g;
  }

  template <class T>
  void run(float* x, int64_t count, int64_t m, int64_t n,
           const std::vector<NsCoefficients>& coefficients, const OrthogonalizeOptions& options,
           cudaStream_t stream, int* nonfinite) {
    if (!capture_graphs) {
      enqueue<T>(ws, x, count, m, n, coefficients, options, stream, nonfinite);
      return;
    }
    GraphKey key{count,       m,
                 n,           std::is_same_v<T, __nv_bfloat16>,
                 options.eps, options.eps_mode,
                 {},          gram_restart_of(options)};
    for (const NsCoefficients& k : coefficients)
      key.coefficients.insert(key.coefficients.end(), {k.a, k.b, k.c});
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      // The first call of a key runs uncaptured, then captures for the next calls: cuBLAS and
      // lazily loaded modules warm up outside a capture (as PyTorch advises before
      // torch.cuda.graph; gpu-review F7), and the first step does not depend on the capture.
      enqueue<T>(ws, x, count, m, n, coefficients, options, stream, nonfinite);
      graphs.emplace(key, capture<T>(key, coefficients, options));
      return;
    }
    CapturedGraph& g = *it->second;
    const size_t bytes = sizeof(float) * static_cast<size_t>(count * m * n);
    MUON_CUDA_CHECK(cudaMemcpyAsync(g.io.get(), x, bytes, cudaMemcpyDeviceToDevice, stream));
    MUON_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    MUON_CUDA_CHECK(cudaMemcpyAsync(x, g.io.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    or_flag<<<1, 1, 0, stream>>>(g.flag.as<int>(), nonfinite);
    MUON_CUDA_CHECK(cudaGetLastError());
  }

  // Declaration order = construction order; destruction runs in reverse: graphs and buffers,
  // the handle, then its workspace.
  int device = 0;
  bool capture_graphs;
  DeviceBuffer blas_workspace;
  BlasHandle blas;
  bool bound = false;
  cudaStream_t bound_stream = nullptr;
  std::unique_ptr<DeviceStream> capture_stream;
  Workspace ws;
  std::map<GraphKey, std::unique_ptr<CapturedGraph>> graphs;
};

DeviceNewtonSchulz::DeviceNewtonSchulz(bool capture_graphs)
    : impl_(std::make_unique<Impl>(capture_graphs)) {}

DeviceNewtonSchulz::~DeviceNewtonSchulz() {
  // Let queued work that uses the buffers and graphs finish before they are released.
  MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(impl_->device));
  const auto sync = device_sync_scope();  // not during another instance's capture (F7)
  MUON_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
}

void DeviceNewtonSchulz::run(float* x, int64_t count, int64_t rows, int64_t cols,
                             const std::vector<NsCoefficients>& coefficients,
                             const OrthogonalizeOptions& options, Precision precision,
                             StreamHandle stream, int* nonfinite) {
  if (count <= 0 || rows <= 0 || cols <= 0) return;
  if (rows > cols) {
    throw InvalidArgument("newton_schulz_batch needs wide matrices (rows <= cols), got " +
                          std::to_string(rows) + "x" + std::to_string(cols));
  }
  if (cols > INT_MAX || count > INT_MAX) {
    throw InvalidArgument("matrix batch " + std::to_string(count) + "x" + std::to_string(rows) +
                          "x" + std::to_string(cols) + " exceeds cuBLAS' 32-bit dimensions");
  }
  MUON_CUDA_CHECK(cudaSetDevice(impl_->device));
  switch (precision) {
    case Precision::bf16:
      impl_->run<__nv_bfloat16>(x, count, rows, cols, coefficients, options, stream, nonfinite);
      return;
    case Precision::fp32:
      impl_->run<float>(x, count, rows, cols, coefficients, options, stream, nonfinite);
      return;
    case Precision::torch_bf16:
      throw InvalidArgument(
          "precision torch_bf16 (torch.optim.Muon's bf16 rounding points) is emulated by the CPU "
          "backend only; on the GPU, bf16 (the default) rounds the same products");
    case Precision::backend_default:
      break;
  }
  throw InvalidArgument("DeviceNewtonSchulz::run needs Precision fp32 or bf16, not the default");
}

size_t DeviceNewtonSchulz::captured_graphs() const {
  return impl_->graphs.size();
}

}  // namespace muon
