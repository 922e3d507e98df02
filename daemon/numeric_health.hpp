// Numeric health of Newton-Schulz results: how far an update is from orthogonal, and whether it
// holds NaN or Inf. Measured by the scheduler's worker on a sample of the updates
// (--health-sample-every) and exported as metrics.
//
// Newton-Schulz with the quintic schedules does not converge to exact orthogonality: it maps each
// normalized singular value s of the input into a band around 1 (for `keller`, 5 steps, every
// s >= 1e-2 lands in [0.68, 1.13]; see kernels/ns_schedule.hpp). The error of a healthy update is
// therefore not ~0 but bounded by that band; an error above the bound means singular values
// outside it (directions below 1e-2 of the norm, a rank-deficient gradient) or a numerical
// failure.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/muon_options.hpp"

namespace muon::daemon {

/// What one measurement found.
struct NumericHealth {
  /// Largest orthogonality error over the matrices (and row blocks) of the parameter:
  /// ||X X^T - I||_F / sqrt(m) for the wide orientation X (m x k, m <= k) of the unscaled
  /// Newton-Schulz output, i.e. the RMS of (s_i^2 - 1) over the m singular values. NaN when no
  /// block was finite.
  double orthogonality_error = 0.0;
  /// Non-finite values (NaN, +-Inf) in the update.
  int64_t nonfinite = 0;
};

/// Measures an update U = f * NS(X) of `shape` computed with `options` (f = extra_scale *
/// scale_factor per row block, as Backend::orthogonalize applies it). The unscaled output is
/// U / f; its Gram matrix (X X^T, or X^T X for a tall block) is formed with cblas_ssyrk with
/// alpha = 1/f^2, in fp32, and the error accumulated in double. A block whose factor is 0 or
/// which holds non-finite values is left out of the error (its values are counted in
/// `nonfinite`). `gram` is scratch (resized as needed), so a caller can keep it warm.
///   update: host fp32, row-major, shape.numel() elements.
/// Throws InvalidArgument for bad shapes or row splits (as validate() would).
NumericHealth measure_numeric_health(const float* update, const MatrixShape& shape,
                                     const OrthogonalizeOptions& options, std::vector<float>& gram);

/// The default warning threshold of a schedule: the largest |s^2 - 1| over the band
/// [lo, hi] = ns_promised_band(coefficients(steps), 1e-2) (1 when the band holds 0). With every
/// singular value inside the band the error cannot exceed it. `keller` (5 steps): 0.535.
double default_health_threshold(const OrthogonalizeOptions& options);

}  // namespace muon::daemon
