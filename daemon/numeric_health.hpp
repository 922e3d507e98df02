// Numeric health of Newton-Schulz results: how far an update is from orthogonal, how far it may
// be given the matrix it came from, and whether it holds NaN or Inf. Measured by the scheduler's
// worker on a sample of the updates (--health-sample-every) and exported as metrics.
//
// Newton-Schulz with the quintic schedules does not converge to exact orthogonality: it maps each
// normalized singular value s of its input to f(s), f the composed scalar polynomial of the
// schedule (kernels/ns_schedule.hpp), and keeps the singular vectors. Directions with s of
// 1e-2 and more land in a band around 1 (keller, 5 steps: [0.68, 1.13]), but a direction with a
// tiny s stays small (f(s) ~ 487 s for keller), and real gradients have many such directions,
// most of all in the first steps of a run. A fixed threshold (the band's edge) therefore fires
// on healthy runs. So the check compares the measured error with the error the schedule gives
// *this* input: the singular values of the normalized input (eigenvalues of its Gram matrix, in
// double) mapped through f. A healthy update sits at that expected error up to the rounding of
// the products (health_tolerance); a failure (wrong coefficients, a corrupted or mis-scaled
// result, a numerical blow-up) sits above it. Without the input, the band's edge is used.
//
// Cost of one sample, per m x k block (m <= k): the Gram of the output (m^2 k, fp32 SYRK) and of
// the input (m^2 k, double SYRK), and the input's eigenvalues (about 4/3 m^3 in double, Eigen):
// milliseconds for m = 128, about a second for m = 1024, tens of seconds for m = 4096. Sample
// large models rarely.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/muon_options.hpp"

namespace muon::daemon {

/// What one measurement found.
struct NumericHealth {
  /// ||X X^T - I||_F / sqrt(m) for the wide orientation X (m x k, m <= k) of the unscaled
  /// Newton-Schulz output, i.e. the RMS of (s_i^2 - 1) over its m singular values; of the
  /// matrix (or row block, or batch entry) furthest above its threshold. NaN when no block was
  /// finite.
  double orthogonality_error = 0.0;
  /// The same error of U f(S) V^T for that block's input U S V^T: what the schedule gives this
  /// input exactly. NaN when the input was not measured.
  double expected_error = 0.0;
  /// The error above which the sample is unhealthy: expected_error + health_tolerance, or the
  /// schedule's band edge (default_health_threshold) when the input was not measured.
  double threshold = 0.0;
  /// Non-finite values (NaN, +-Inf) in the update.
  int64_t nonfinite = 0;
  /// Non-finite values, or an error above the threshold.
  bool unhealthy() const { return nonfinite > 0 || !(orthogonality_error <= threshold); }
};

/// The matrix a Muon step handed to Newton-Schulz, when the caller has it: the gradient and the
/// momentum after the step (host fp32, shape.numel() each; momentum null for convention none),
/// from which the (Nesterov) input is rebuilt with kernels/elementwise.hpp's
/// orthogonalize_input, as the backends build it.
struct HealthInput {
  const float* grad = nullptr;
  const float* momentum = nullptr;
  MomentumOptions momentum_options;
};

/// Reusable buffers of the measurement (a caller keeps one per thread, warm).
struct HealthScratch {
  std::vector<float> gram;
  std::vector<double> block, dgram;
};

/// Measures an update U = f * NS(X) of `shape` computed with `options` (f = extra_scale *
/// scale_factor per row block, as Backend::orthogonalize applies it), its products computed at
/// `products` precision (fp32 or bf16: the backend's resolved precision). The unscaled output is
/// U / f; its Gram matrix (X X^T, or X^T X for a tall block) is formed with cblas_ssyrk with
/// alpha = 1/f^2, in fp32, and the error accumulated in double. With `input`, each block's
/// expected error comes from its input's spectrum (see the file comment). A block whose factor
/// is 0 or which holds non-finite values is left out of the error (its values are counted in
/// `nonfinite`).
///   update: host fp32, row-major, shape.numel() elements.
/// Throws InvalidArgument for bad shapes or row splits (as validate() would).
NumericHealth measure_numeric_health(const float* update, const MatrixShape& shape,
                                     const OrthogonalizeOptions& options, Precision products,
                                     const HealthInput* input, HealthScratch& scratch);

/// The error `options`' schedule gives a matrix whose normalized singular values are `s`:
/// sqrt(mean_i (f(s_i)^2 - 1)^2), f = ns_scalar_map of the schedule's coefficients.
double expected_orthogonality_error(const OrthogonalizeOptions& options,
                                    const std::vector<double>& s);

/// Allowance between a measured and an expected error for the rounding of the products: 0.02
/// for fp32 (the CPU backend lands within 1e-3 of the expected error on the spectra of
/// tests/observability/test_numeric_health.cpp; 0.05 for the Gram algorithm, which squares the
/// condition), 0.10 for bf16 (8 bits of mantissa; not yet measured on a GPU).
double health_tolerance(const OrthogonalizeOptions& options, Precision products);

/// The threshold without the input: the largest |s^2 - 1| over the band [lo, hi] =
/// ns_promised_band(coefficients(steps), 1e-2) (1 when the band holds 0). With every singular
/// value of the input at or above 1e-2 of its norm the error cannot exceed it. `keller` (5
/// steps): 0.535.
double default_health_threshold(const OrthogonalizeOptions& options);

}  // namespace muon::daemon
