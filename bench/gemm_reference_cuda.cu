// cuBLAS bf16 GEMM reference (see gemm_reference.hpp): the 3 * steps products of one
// Newton-Schulz run through cublasGemmEx, bf16 in/out, fp32 accumulation, device buffers only.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "bench/gemm_reference.hpp"
#include "core/cuda_check.hpp"

namespace muon::bench {
namespace {

__nv_bfloat16* device_bf16(size_t count, std::mt19937& gen, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<__nv_bfloat16> host(count);
  for (auto& v : host) v = __float2bfloat16(dist(gen));
  void* p = nullptr;
  MUON_CUDA_CHECK(cudaMalloc(&p, count * sizeof(__nv_bfloat16)));
  MUON_CUDA_CHECK(
      cudaMemcpy(p, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  return static_cast<__nv_bfloat16*>(p);
}

}  // namespace

struct CublasGemmReference::Impl {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  // Row-major X (m x n), A, B (m x m) inputs; scratch outputs of the same shapes.
  __nv_bfloat16 *x = nullptr, *a = nullptr, *b = nullptr;
  __nv_bfloat16 *a_out = nullptr, *aa_out = nullptr, *x_out = nullptr;

  ~Impl() {
    for (void* p :
         {static_cast<void*>(x), static_cast<void*>(a), static_cast<void*>(b),
          static_cast<void*>(a_out), static_cast<void*>(aa_out), static_cast<void*>(x_out)}) {
      if (p) cudaFree(p);  // destructor: errors are not reportable here
    }
    if (handle) cublasDestroy(handle);
    if (stream) cudaStreamDestroy(stream);
  }
};

CublasGemmReference::CublasGemmReference(int64_t rows, int64_t cols, int steps, int device)
    : m_(std::min(rows, cols)),
      n_(std::max(rows, cols)),
      steps_(steps),
      impl_(std::make_unique<Impl>()) {
  MUON_CUDA_CHECK(cudaSetDevice(device));
  MUON_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  MUON_CUBLAS_CHECK(cublasCreate(&impl_->handle));
  MUON_CUBLAS_CHECK(cublasSetStream(impl_->handle, impl_->stream));
  const auto mm = static_cast<size_t>(m_ * m_), mn = static_cast<size_t>(m_ * n_);
  std::mt19937 gen(12345);
  // Magnitudes of a normalized X (entries ~ 1/sqrt(mn)) and of A, B (entries ~ 1/m); the GEMM
  // rate does not depend on them as long as nothing is denormal or non-finite.
  impl_->x = device_bf16(mn, gen, static_cast<float>(1.7 / std::sqrt(static_cast<double>(mn))));
  impl_->a = device_bf16(mm, gen, static_cast<float>(1.0 / m_));
  impl_->b = device_bf16(mm, gen, static_cast<float>(1.0 / m_));
  impl_->a_out = device_bf16(mm, gen, 0.0f);
  impl_->aa_out = device_bf16(mm, gen, 0.0f);
  impl_->x_out = device_bf16(mn, gen, 0.0f);
  MUON_CUDA_CHECK(cudaDeviceSynchronize());
}

CublasGemmReference::~CublasGemmReference() = default;

void CublasGemmReference::run(int steps) {
  // cuBLAS is column-major: a row-major r x c buffer is its c x r transpose there. With
  // Xc = X^T (n x m, ld n), Ac = A^T, Bc = B^T (m x m, ld m):
  //   A = X X^T   ->  Ac_out = Xc^T Xc          (m x m x n, op T/N)
  //   A A         ->  (A A)^T = Ac Ac            (m x m x m; A is symmetric in the real run)
  //   Y = B X     ->  Yc = Y^T = X^T B^T = Xc Bc (n x m x m, op N/N)
  const int M = static_cast<int>(m_), N = static_cast<int>(n_);
  const float one = 1.0f, zero = 0.0f;
  Impl& s = *impl_;
  if (steps < 0) steps = steps_;
  for (int k = 0; k < steps; ++k) {
    MUON_CUBLAS_CHECK(cublasGemmEx(s.handle, CUBLAS_OP_T, CUBLAS_OP_N, M, M, N, &one, s.x,
                                   CUDA_R_16BF, N, s.x, CUDA_R_16BF, N, &zero, s.a_out, CUDA_R_16BF,
                                   M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    MUON_CUBLAS_CHECK(cublasGemmEx(s.handle, CUBLAS_OP_N, CUBLAS_OP_N, M, M, M, &one, s.a,
                                   CUDA_R_16BF, M, s.a, CUDA_R_16BF, M, &zero, s.aa_out,
                                   CUDA_R_16BF, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    MUON_CUBLAS_CHECK(cublasGemmEx(s.handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, M, &one, s.x,
                                   CUDA_R_16BF, N, s.b, CUDA_R_16BF, M, &zero, s.x_out, CUDA_R_16BF,
                                   N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  MUON_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

}  // namespace muon::bench
