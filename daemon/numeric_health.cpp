#include "daemon/numeric_health.hpp"

#include <cblas.h>

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/elementwise.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/scale_rule.hpp"

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

// The normalized singular values of one block of the Newton-Schulz input: the block (rows rb of
// `cols` at `at`, element i of the parameter rebuilt from grad and momentum as the backends do)
// in double, divided by its Frobenius norm as the schedule's normalization does (eps add or
// clamp); then the eigenvalues of its m x m Gram matrix (wide orientation), whose square roots
// they are. Empty when the block is all zero (Newton-Schulz returns zeros, expected error 1).
std::vector<double> input_singular_values(const HealthInput& in, int64_t at, int64_t rb,
                                          int64_t cols, const OrthogonalizeOptions& options,
                                          HealthScratch& scratch) {
  const auto& mo = in.momentum_options;
  const int64_t n = rb * cols;
  scratch.block.resize(static_cast<size_t>(n));
  double norm_sq = 0.0;
  const MomentumCoefficients coeff = momentum_coefficients(mo.mu);
  for (int64_t i = 0; i < n; ++i) {
    const float m = in.momentum != nullptr ? in.momentum[at + i] : 0.0f;
    const double v =
        orthogonalize_input(in.momentum != nullptr ? mo.convention : MomentumConvention::none,
                            mo.nesterov, m, in.grad[at + i], coeff);
    scratch.block[static_cast<size_t>(i)] = v;
    norm_sq += v * v;
  }
  const double norm = std::sqrt(norm_sq);
  const double eps = options.eps;
  const double denom = options.eps_mode == EpsMode::add ? norm + eps : std::max(norm, eps);
  if (!(norm > 0.0) || !(denom > 0.0)) return {};
  const bool tall = rb > cols;
  const int64_t m = tall ? cols : rb, k = tall ? rb : cols;
  scratch.dgram.assign(static_cast<size_t>(m * m), 0.0);
  const double alpha = 1.0 / (denom * denom);
  // Row-major upper triangle = column-major lower triangle, which Eigen's solver reads.
  cblas_dsyrk(CblasRowMajor, CblasUpper, tall ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(k), alpha, scratch.block.data(), static_cast<blasint>(cols), 0.0,
              scratch.dgram.data(), static_cast<blasint>(m));
  const Eigen::Map<const Eigen::MatrixXd> gram(scratch.dgram.data(), m, m);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(gram, Eigen::EigenvaluesOnly);
  std::vector<double> s(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i)
    s[static_cast<size_t>(i)] = std::sqrt(std::max(0.0, solver.eigenvalues()[i]));
  return s;
}

}  // namespace

double expected_orthogonality_error(const OrthogonalizeOptions& options,
                                    const std::vector<double>& s) {
  if (s.empty()) return 1.0;
  const auto coefficients = ns_coefficients(options);  // the schedule's, or the user's own
  double sum = 0.0;
  for (double x : s) {
    const double f = ns_scalar_map(coefficients, std::min(x, 1.0));
    const double d = f * f - 1.0;
    sum += d * d;
  }
  return std::sqrt(sum / static_cast<double>(s.size()));
}

double health_tolerance(const OrthogonalizeOptions& options, Precision products) {
  if (products == Precision::bf16 || products == Precision::torch_bf16) return 0.10;
  return options.algorithm == NsAlgorithm::gram ? 0.05 : 0.02;
}

NumericHealth measure_numeric_health(const float* update, const MatrixShape& shape,
                                     const OrthogonalizeOptions& options, Precision products,
                                     const HealthInput* input, HealthScratch& scratch) {
  const auto blocks = row_blocks(options, shape, "health sample");
  const int64_t c = shape.cols, slice = shape.rows * shape.cols;
  const double band = default_health_threshold(options);
  const double tolerance = health_tolerance(options, products);
  NumericHealth h;
  h.orthogonality_error = std::numeric_limits<double>::quiet_NaN();
  h.expected_error = std::numeric_limits<double>::quiet_NaN();
  h.threshold = band;
  double worst_margin = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < shape.batch; ++b) {
    int64_t row0 = 0;
    for (const int64_t rb : blocks) {
      const int64_t at = b * slice + row0 * c;
      const float* x = update + at;
      row0 += rb;
      const int64_t bad = count_nonfinite(x, rb, c, c);
      h.nonfinite += bad;
      const double factor = options.extra_scale * scale_factor(options.scale_rule, rb, c);
      if (bad != 0 || !(factor != 0.0) || !std::isfinite(factor)) continue;
      // Wide orientation: X = block (rb <= c) or block^T (rb > c); m = min(rb, c).
      const bool tall = rb > c;
      const int64_t m = tall ? c : rb, k = tall ? rb : c;
      scratch.gram.resize(static_cast<size_t>(m * m));
      const float alpha = static_cast<float>(1.0 / (factor * factor));
      cblas_ssyrk(CblasRowMajor, CblasUpper, tall ? CblasTrans : CblasNoTrans,
                  static_cast<blasint>(m), static_cast<blasint>(k), alpha, x,
                  static_cast<blasint>(c), 0.0f, scratch.gram.data(), static_cast<blasint>(m));
      const double err =
          std::sqrt(distance_to_identity_sq(scratch.gram.data(), m) / static_cast<double>(m));
      double expected = std::numeric_limits<double>::quiet_NaN();
      double threshold = band;
      if (input != nullptr && input->grad != nullptr) {
        expected = expected_orthogonality_error(
            options, input_singular_values(*input, at, rb, c, options, scratch));
        threshold = expected + tolerance;
      }
      // The block furthest above (or least below) its own threshold speaks for the parameter.
      if (err - threshold > worst_margin) {
        worst_margin = err - threshold;
        h.orthogonality_error = err;
        h.expected_error = expected;
        h.threshold = threshold;
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
