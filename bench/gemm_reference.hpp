// GEMM references for the Newton-Schulz benchmarks: the same products one Newton-Schulz run
// forms, as plain GEMM calls and nothing else. Their rate is the physical limit of this work on
// a backend, so a benchmark reports NS speed as ns_rate / gemm_rate (architecture guide, §9).
//
// One NS step on a wide m x n matrix X (m = min(rows, cols), n = max(rows, cols)) is
//   A = X X^T   (m x m x n product, 2 m^2 n flops)
//   A A         (m x m x m product, 2 m^3 flops)
//   B X         (m x n x m product, 2 m^2 n flops)
// so its nominal cost is 4 m^2 n + 2 m^3 flops, whatever algorithm (syrk, gram) actually runs.
// This header stays free of CUDA types so plain C++ translation units can include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace muon::bench {

/// Nominal flops of `steps` Newton-Schulz steps on a rows x cols matrix:
/// steps * (4 m^2 n + 2 m^3), m = min(rows, cols), n = max(rows, cols). The same number for every
/// algorithm, so ns_gflops of syrk/gram is a "nominal" rate that can exceed the GEMM rate.
double ns_nominal_flops(int64_t rows, int64_t cols, int steps);

/// `steps` x {sgemm m x m x n (X X^T), sgemm m x m x m (A A), sgemm m x n x m (B X)} in fp32 on
/// OpenBLAS, row-major, exactly the transpose flags the CPU backend's plain iteration uses.
/// Inputs are fixed, realistic values (X normalized, A = X X^T, B = b A + c A A with Keller's
/// coefficients); outputs go to scratch buffers, so every run does identical work and no value
/// drifts towards overflow or denormals. Uses OpenBLAS' process-wide thread setting.
class CpuGemmReference {
 public:
  CpuGemmReference(int64_t rows, int64_t cols, int steps);
  /// Runs the products of `steps` NS steps (all of them when < 0); returns when they are done.
  /// Every step is the same three products, so k steps take k times one step's time.
  void run(int steps = -1);
  int steps() const { return steps_; }
  double flops() const { return ns_nominal_flops(m_, n_, steps_); }

 private:
  int64_t m_, n_;
  int steps_;
  std::vector<float> x_, a_, b_, a_out_, aa_out_, x_out_;
};

/// OpenBLAS' build description (version, core type, max threads), for the benchmark context.
std::string openblas_description();

#ifdef MUON_HAVE_CUDA
/// The cuBLAS counterpart: the same 3 * steps products through cublasGemmEx with CUDA_R_16BF
/// inputs and outputs, CUBLAS_COMPUTE_32F accumulation, on device-resident buffers (no host
/// transfers). Throws muon::DeviceError when CUDA or cuBLAS fails (e.g. no GPU).
class CublasGemmReference {
 public:
  CublasGemmReference(int64_t rows, int64_t cols, int steps, int device);
  ~CublasGemmReference();
  CublasGemmReference(const CublasGemmReference&) = delete;
  CublasGemmReference& operator=(const CublasGemmReference&) = delete;
  /// Enqueues the products of `steps` NS steps (all when < 0) and waits for them
  /// (cudaStreamSynchronize).
  void run(int steps = -1);
  int steps() const { return steps_; }
  double flops() const { return ns_nominal_flops(m_, n_, steps_); }

 private:
  struct Impl;
  int64_t m_, n_;
  int steps_;
  std::unique_ptr<Impl> impl_;
};
#endif

}  // namespace muon::bench
