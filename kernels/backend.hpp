// The one interface the server, the client's in-process mode and the CLI call for Muon math, with
// a CPU implementation (OpenBLAS, the oracle) and a CUDA one (cuBLAS). The shared part here does
// what must be identical on both: validation, the non-finite policy, momentum, row blocks and
// orientation; a backend only runs Newton-Schulz on a batch of same-shape wide matrices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/muon_options.hpp"
#include "kernels/ns_schedule.hpp"

namespace muon {

/// Start-up settings of a backend.
struct BackendConfig {
  int cpu_threads = 0;  ///< OpenBLAS threads; 0 = leave OpenBLAS' own setting
  int cuda_device = 0;  ///< device ordinal for the CUDA backend
};

/// Muon math on host buffers. Not thread-safe: one backend per worker thread.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu" or "cuda".
  virtual std::string_view name() const = 0;
  /// The precision `Precision::backend_default` resolves to here.
  virtual Precision default_precision() const = 0;
  /// What the speed of this backend's products depends on, as one line: the CPU model and core
  /// count, the BLAS library and its current thread count (cpu); the GPU model and the cuBLAS
  /// version (cuda). NsAlgorithm::automatic's choices are cached per this key
  /// (kernels/ns_choice.hpp).
  virtual std::string machine_key() const = 0;

  /// U = extra_scale * scale_rule(block) * NS(X) for every matrix of the batch and every row
  /// block, each normalized on its own.
  ///   shape: [batch, rows, cols]; in, out: host fp32, row-major, shape.numel() elements; `in`
  ///   may equal `out`.
  /// Returns true, or false when `in` is not finite and the policy is skip (then `out` is zero).
  /// Throws InvalidArgument (shape/options), NonFiniteError (policy error; the message names
  /// `matrix_name`), DeviceError.
  bool orthogonalize(std::string_view matrix_name, const MatrixShape& shape, const float* in,
                     float* out, const OrthogonalizeOptions& options);

  /// Makes auto's choices for every row block of `shape` now (measuring the ones the table lacks,
  /// kernels/ns_choice.hpp) instead of at the first orthogonalize: the server calls it when a
  /// parameter registers, so the calibration runs before the first step rather than inside it.
  /// Computes nothing else; a no-op for an algorithm named by the caller. Throws InvalidArgument
  /// (shape/options, as orthogonalize would).
  void prepare(std::string_view matrix_name, const MatrixShape& shape,
               const OrthogonalizeOptions& options);

  /// One Muon step: momentum <- momentum_step(momentum, grad), update <- U of the
  /// (Nesterov) input, per MuonOptions. With convention `none` the gradient is orthogonalized as
  /// it is and `momentum` may be null. Nothing is written to `momentum` when the gradient is not
  /// finite (error: NonFiniteError; skip: update zeroed, returns false).
  ///   grad, momentum, update: host fp32, shape.numel() elements each, not aliasing.
  bool muon_update(std::string_view matrix_name, const MatrixShape& shape, const float* grad,
                   float* momentum, float* update, const MuonOptions& options);

 protected:
  /// Newton-Schulz in place on `count` contiguous wide matrices x[count][rows][cols]
  /// (rows <= cols), each first normalized by its own Frobenius norm per `options.eps_mode`;
  /// an all-zero matrix stays exactly zero. No scale is applied. `options.algorithm` is never
  /// automatic here (orthogonalize resolves it first).
  virtual void newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                                   const std::vector<NsCoefficients>& coefficients,
                                   const OrthogonalizeOptions& options) = 0;

  /// How many matrices newton_schulz_side_by_side runs at once (one BLAS thread each); 1 (the
  /// default, and CUDA's) = nothing to run side by side.
  virtual int side_by_side_width() const { return 1; }

  /// newton_schulz_batch with every matrix on one BLAS thread, side_by_side_width() of them at
  /// once. Each matrix's bits are what it gets alone on one thread, whatever `count` is. The
  /// default runs newton_schulz_batch.
  virtual void newton_schulz_side_by_side(float* x, int64_t count, int64_t rows, int64_t cols,
                                          const std::vector<NsCoefficients>& coefficients,
                                          const OrthogonalizeOptions& options) {
    newton_schulz_batch(x, count, rows, cols, coefficients, options);
  }

 private:
  /// How a block runs: the algorithm (never automatic) and, for auto's choices, side by side.
  struct Resolved {
    OrthogonalizeOptions options;
    bool side_by_side = false;
  };
  /// `options` with NsAlgorithm::automatic replaced by the choice for wide m x n blocks, and
  /// that choice's batching (kernels/ns_choice.hpp: cached per machine_key(), measured here when
  /// absent). An algorithm named by the caller runs one matrix at a time.
  Resolved resolved(const OrthogonalizeOptions& options, int64_t m, int64_t n,
                    const std::vector<NsCoefficients>& coefficients);

  std::vector<float> work_;  // reused across calls: blocks in wide orientation
};

/// Creates a backend: "cpu", "cuda" or "auto" (CUDA when a usable GPU is present, else CPU).
/// Throws BackendUnavailable for "cuda" when the build has no CUDA or no GPU is usable (the
/// message says why), InvalidArgument for an unknown kind.
std::unique_ptr<Backend> make_backend(std::string_view kind, const BackendConfig& config = {});

/// Whether this build contains the CUDA backend.
bool cuda_backend_built();

}  // namespace muon
