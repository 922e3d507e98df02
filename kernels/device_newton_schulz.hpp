// Newton-Schulz on device-resident matrices with cuBLAS, enqueued on a caller's stream: the one
// implementation behind the CUDA backend's host API (kernels/cuda_backend.cu) and the device
// Muon step (kernels/device_muon.hpp). The header names no CUDA type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device_stream.hpp"
#include "kernels/muon_options.hpp"
#include "kernels/ns_schedule.hpp"

namespace muon {

/// Normalize + Newton-Schulz steps on `count` contiguous wide fp32 matrices in device memory
/// (Jordan et al. 2024, "Muon"; per step A = X X^T, B = b A + c A A, X <- a X + B X with the
/// schedule's coefficients), as strided-batched cuBLAS GEMMs:
///   Precision::bf16 (the default): X, A, B stored in bf16 after normalization, products
///     accumulate in fp32 (CUBLAS_COMPUTE_32F), like the torch reference on bf16 tensors;
///   Precision::fp32: fp32 storage and products without TF32 (CUBLAS_COMPUTE_32F_PEDANTIC).
/// Each matrix is divided by its own Frobenius norm per options.eps_mode (small deterministic
/// reduction kernels, no float atomics); an all-zero matrix stays exactly zero. NsAlgorithm syrk
/// runs as the plain GEMMs (same polynomial; cuBLAS has no bf16 or batched SYRK); gram runs the
/// restarted Gram-space iteration (options.gram_restart; see CpuBackend and muon_options.hpp)
/// as batched m x m GEMMs, with R, P and Q stored in T like A and B.
///
/// Graph capture (capture_graphs): the first call for a (count, rows, cols, precision, eps,
/// eps mode, coefficients, gram or not and its restart) key runs uncaptured (a warm-up: cuBLAS
/// and lazily loaded modules are first used outside a capture) and then captures the whole
/// sequence once into a CUDA graph with its own buffers (cudaStreamBeginCapture/EndCapture in
/// cudaStreamCaptureModeThreadLocal, under capture_scope() so that no other thread synchronizes
/// the device meanwhile: device_sync_guard.hpp; cudaGraphInstantiate); later calls with that key
/// copy X into the graph's buffer, replay it (cudaGraphLaunch) and copy the result back: the same
/// kernels and cuBLAS calls on the same handle and workspace, so the same bits as the uncaptured
/// run. Each captured key keeps its buffers (about 2x the key's X plus its Gram matrices) for the
/// object's lifetime.
///
/// Deterministic on a given GPU and cuBLAS version. Bound to the device current at construction.
/// Not thread-safe, and calls on different streams must be ordered by the caller (the workspace
/// is shared): one object per worker, or one stream per object.
class DeviceNewtonSchulz {
 public:
  /// Creates the cuBLAS handle (with its own 32 MiB workspace, so capture never allocates) and,
  /// with capture_graphs, the capture stream. Throws DeviceError (no GPU, cublasCreate failing).
  explicit DeviceNewtonSchulz(bool capture_graphs = false);
  ~DeviceNewtonSchulz();
  DeviceNewtonSchulz(const DeviceNewtonSchulz&) = delete;
  DeviceNewtonSchulz& operator=(const DeviceNewtonSchulz&) = delete;

  /// Enqueues Newton-Schulz in place on x (device fp32 [count][rows][cols], rows <= cols) on
  /// `stream` and returns without waiting. `precision` must be fp32 or bf16 (resolve
  /// backend_default first). ORs 1 into *nonfinite (a device int, required) when a result is NaN
  /// or Inf.
  /// Throws InvalidArgument for tall matrices, dimensions beyond cuBLAS' 32 bits or
  /// Precision::backend_default; DeviceError when a CUDA or cuBLAS call fails.
  void run(float* x, int64_t count, int64_t rows, int64_t cols,
           const std::vector<NsCoefficients>& coefficients, const OrthogonalizeOptions& options,
           Precision precision, StreamHandle stream, int* nonfinite);

  /// Number of captured graphs (0 without capture_graphs).
  size_t captured_graphs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon
