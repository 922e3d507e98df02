// CPU backend: fp32 Newton-Schulz on OpenBLAS (sgemm, ssyrk). The default where no GPU is
// present and the oracle every other path is tested against.
#pragma once

#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace muon {

/// Newton-Schulz with OpenBLAS in fp32. Deterministic at a fixed OpenBLAS thread count: the same
/// input gives the same bits on every call, and a batch the same bits as a loop over its
/// matrices. A different thread count changes the last bits (OpenBLAS 0.3.21 splits its sgemm
/// and ssyrk otherwise: 1 and 2 threads differ from 64 x 64 up), so every process that must agree
/// bitwise (server, in-process reference) sets BackendConfig::cpu_threads to the same value, and
/// side by side (one thread per matrix) is a property of the block shape, lone matrices included.
class CpuBackend final : public Backend {
 public:
  /// Sets OpenBLAS' thread count when config.cpu_threads > 0 (a process-wide setting).
  explicit CpuBackend(const BackendConfig& config = {});
  std::string_view name() const override { return "cpu"; }
  Precision default_precision() const override { return Precision::fp32; }
  /// "cpu <model> x<logical cpus> openblas <config> threads=<current count>".
  std::string machine_key() const override;

  /// OpenBLAS' current thread count: that many matrices side by side use the same cores.
  int side_by_side_width() const override;

 protected:
  /// Throws InvalidArgument for Precision::bf16 (bf16 products are CUDA-only);
  /// Precision::torch_bf16 is emulated (fp32 GEMMs, every stored matrix rounded to bf16).
  void newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                           const std::vector<NsCoefficients>& coefficients,
                           const OrthogonalizeOptions& options) override;

 private:
  /// Matrices [first, last) of the batch side by side: OpenBLAS on one thread meanwhile, one
  /// worker thread per side_by_side_width(), each taking the next matrix (which thread runs a
  /// matrix does not change its bits: every one runs on one BLAS thread).
  void newton_schulz_side_by_side(float* x, int64_t count, int64_t rows, int64_t cols,
                                  const std::vector<NsCoefficients>& coefficients,
                                  const OrthogonalizeOptions& options) override;

 private:
  // Workspace of one thread, reused across calls (fresh pages are ~20x slower to write than warm
  // ones).
  struct Workspace {
    std::vector<float> a, b, x2, q, t;
  };
  static void one_matrix(Workspace& w, float* x, int64_t rows, int64_t cols,
                         const std::vector<NsCoefficients>& coefficients,
                         const OrthogonalizeOptions& options);
  static void plain(Workspace& w, float* in, float* x, int64_t m, int64_t n,
                    const std::vector<NsCoefficients>& coeffs, bool narrow);
  static void syrk(Workspace& w, float* in, float* x, int64_t m, int64_t n,
                   const std::vector<NsCoefficients>& coeffs);
  static void gram(Workspace& w, float* in, float* x, int64_t m, int64_t n,
                   const std::vector<NsCoefficients>& coeffs, int restart);
  static void gram_run(Workspace& w, const float* in, float* out, int64_t m, int64_t n,
                       const NsCoefficients* coeffs, size_t count);

  std::vector<Workspace> work_{1};  // [0]: the calling thread; [i]: side-by-side worker i
};

/// Frobenius norm of n floats, accumulated in double in 8 interleaved partial sums added in a
/// fixed order (deterministic: the same bits for the same input on every call and machine).
double frobenius_norm(const float* x, int64_t n);

}  // namespace muon
