// CPU backend: fp32 Newton-Schulz on OpenBLAS (sgemm, ssyrk). The default where no GPU is
// present and the oracle every other path is tested against.
#pragma once

#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace muon {

/// Newton-Schulz with OpenBLAS in fp32. Deterministic at a fixed OpenBLAS thread count: the same
/// input gives the same bits on every call, and a batch the same bits as a loop over its
/// matrices. A different thread count changes the last bits (OpenBLAS picks other kernels and
/// splits), so every process that must agree bitwise (server, in-process reference) sets
/// BackendConfig::cpu_threads to the same value.
class CpuBackend final : public Backend {
 public:
  /// Sets OpenBLAS' thread count when config.cpu_threads > 0 (a process-wide setting).
  explicit CpuBackend(const BackendConfig& config = {});
  std::string_view name() const override { return "cpu"; }
  Precision default_precision() const override { return Precision::fp32; }
  /// "cpu <model> x<logical cpus> openblas <config> threads=<current count>".
  std::string machine_key() const override;

 protected:
  /// Throws InvalidArgument for Precision::bf16 (bf16 products are CUDA-only);
  /// Precision::torch_bf16 is emulated (fp32 GEMMs, every stored matrix rounded to bf16).
  void newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                           const std::vector<NsCoefficients>& coefficients,
                           const OrthogonalizeOptions& options) override;

 private:
  void plain_or_syrk(float* x, int64_t m, int64_t n, const std::vector<NsCoefficients>& coeffs,
                     bool syrk, bool narrow);
  void gram(float* x, int64_t m, int64_t n, const std::vector<NsCoefficients>& coeffs,
            int restart);
  void gram_run(float* x, int64_t m, int64_t n, const NsCoefficients* coeffs, size_t count);

  // Workspace reused across calls (fresh pages are ~20x slower to write than warm ones).
  std::vector<float> a_, b_, x2_, q_, t_;
};

/// Frobenius norm of n floats, accumulated in double in index order (deterministic).
double frobenius_norm(const float* x, int64_t n);

}  // namespace muon
