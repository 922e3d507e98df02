// Test oracle: what Newton-Schulz must produce, computed from an SVD in double (Eigen).
// Newton-Schulz maps X = U diag(s) V^T (normalized) to U diag(f(s)) V^T with f the composed
// scalar quintic, so the oracle is exact up to the fp32 rounding of the backend under test.
#pragma once

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/ns_schedule.hpp"

namespace muon::testing {

using MatD = Eigen::MatrixXd;
using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A rows x cols fp32 matrix (row-major) U diag(s) V^T with random orthonormal U, V and singular
/// values log-uniform in [s_min, 1] (largest exactly 1, smallest exactly s_min).
inline std::vector<float> matrix_with_spectrum(int rows, int cols, double s_min, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  const int k = std::min(rows, cols);
  MatD a(rows, k), b(cols, k);
  for (int i = 0; i < a.size(); ++i) a.data()[i] = normal(gen);
  for (int i = 0; i < b.size(); ++i) b.data()[i] = normal(gen);
  MatD u = Eigen::HouseholderQR<MatD>(a).householderQ() * MatD::Identity(rows, k);
  MatD v = Eigen::HouseholderQR<MatD>(b).householderQ() * MatD::Identity(cols, k);
  Eigen::VectorXd s(k);
  for (int i = 0; i < k; ++i) s(i) = std::exp(std::log(s_min) * i / std::max(1, k - 1));
  MatD g = u * s.asDiagonal() * v.transpose();
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      out[static_cast<size_t>(i) * cols + j] = static_cast<float>(g(i, j));
  return out;
}

/// Gaussian fp32 values.
inline std::vector<float> gaussian(size_t n, unsigned seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(gen);
  return v;
}

inline MatD to_double(const float* x, int rows, int cols) {
  MatD m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = x[static_cast<size_t>(i) * cols + j];
  return m;
}

/// Result of comparing one Newton-Schulz output with the oracle.
struct OracleReport {
  double rel_error = 0;         ///< ||out - U f(S) V^T||_F / ||U f(S) V^T||_F
  double max_offdiag = 0;       ///< max |(U^T out V)_ij|, i != j: singular vectors kept
  double min_kept = INFINITY;   ///< min diag of U^T out V over directions with s >= s_min
  double max_kept = -INFINITY;  ///< max of the same
};

/// Compares `out` (rows x cols, unscaled NS output) with U f(S) V^T where X = G / (||G|| + eps)
/// and f = ns_scalar_map(coefficients).
inline OracleReport compare_with_oracle(const float* g, const float* out, int rows, int cols,
                                        const std::vector<NsCoefficients>& coefficients, double eps,
                                        double s_min) {
  MatD x = to_double(g, rows, cols);
  x /= (x.norm() + eps);
  Eigen::JacobiSVD<MatD> svd(x, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const auto& s = svd.singularValues();
  Eigen::VectorXd fs(s.size());
  for (int i = 0; i < s.size(); ++i) fs(i) = ns_scalar_map(coefficients, s(i));
  MatD expected = svd.matrixU() * fs.asDiagonal() * svd.matrixV().transpose();
  MatD o = to_double(out, rows, cols);
  OracleReport r;
  r.rel_error = (o - expected).norm() / expected.norm();
  MatD d = svd.matrixU().transpose() * o * svd.matrixV();
  for (int i = 0; i < d.rows(); ++i) {
    for (int j = 0; j < d.cols(); ++j) {
      if (i != j) r.max_offdiag = std::max(r.max_offdiag, std::abs(d(i, j)));
    }
    if (s(i) >= s_min) {
      r.min_kept = std::min(r.min_kept, d(i, i));
      r.max_kept = std::max(r.max_kept, d(i, i));
    }
  }
  return r;
}

}  // namespace muon::testing
