#include "daemon/numeric_health.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/elementwise.hpp"
#include "kernels/ns_schedule.hpp"

namespace muon::daemon {
namespace {

// Non-finite values among the n values of `rows` rows of `cols` at stride `ld`.
int64_t count_nonfinite(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * ld;
    for (int64_t j = 0; j < cols; ++j) bad += is_finite_bits(row[j]) ? 0 : 1;
  }
  return bad;
}

// ||G - I||_F^2 of a symmetric m x m matrix of which ssyrk filled the upper triangle.
double distance_to_identity_sq(const float* g, int64_t m) {
  double sum = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    const double d = static_cast<double>(g[i * m + i]) - 1.0;
    sum += d * d;
    for (int64_t j = i + 1; j < m; ++j) {
      const double v = g[i * m + j];
      sum += 2.0 * v * v;
    }
  }
  return sum;
}

}  // namespace

NumericHealth measure_numeric_health(const float* update, const MatrixShape& shape,
                                     const OrthogonalizeOptions& options,
                                     std::vector<float>& gram) {
  const auto blocks = row_blocks(options, shape, "health sample");
  const int64_t c = shape.cols, slice = shape.rows * shape.cols;
  NumericHealth h;
  h.orthogonality_error = std::numeric_limits<double>::quiet_NaN();
  for (int64_t b = 0; b < shape.batch; ++b) {
    int64_t row0 = 0;
    for (const int64_t rb : blocks) {
      const float* x = update + b * slice + row0 * c;
      row0 += rb;
      const int64_t bad = count_nonfinite(x, rb, c, c);
      h.nonfinite += bad;
      const double factor = options.extra_scale * scale_factor(options.scale_rule, rb, c);
      if (bad != 0 || !(factor != 0.0) || !std::isfinite(factor)) continue;
      // Wide orientation: X = block (rb <= c) or block^T (rb > c); m = min(rb, c).
      const bool tall = rb > c;
      const int64_t m = tall ? c : rb, k = tall ? rb : c;
      gram.resize(static_cast<size_t>(m * m));
      const float alpha = static_cast<float>(1.0 / (factor * factor));
      cblas_ssyrk(CblasRowMajor, CblasUpper, tall ? CblasTrans : CblasNoTrans,
                  static_cast<blasint>(m), static_cast<blasint>(k), alpha, x,
                  static_cast<blasint>(c), 0.0f, gram.data(), static_cast<blasint>(m));
      const double err =
          std::sqrt(distance_to_identity_sq(gram.data(), m) / static_cast<double>(m));
      if (std::isnan(h.orthogonality_error) || err > h.orthogonality_error) {
        h.orthogonality_error = err;
      }
    }
  }
  return h;
}

double default_health_threshold(const OrthogonalizeOptions& options) {
  const auto coefficients = ns_coefficients(options);
  const auto [lo, hi] = ns_promised_band(coefficients, 1e-2);
  if (lo <= 0.0 && hi >= 0.0) return 1.0;
  return std::max(std::abs(lo * lo - 1.0), std::abs(hi * hi - 1.0));
}

}  // namespace muon::daemon
