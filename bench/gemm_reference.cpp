#include "bench/gemm_reference.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace muon::bench {

double ns_nominal_flops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

CpuGemmReference::CpuGemmReference(int64_t rows, int64_t cols, int steps)
    : m_(std::min(rows, cols)), n_(std::max(rows, cols)), steps_(steps) {
  const auto mm = static_cast<size_t>(m_ * m_), mn = static_cast<size_t>(m_ * n_);
  x_.resize(mn);
  a_.resize(mm);
  b_.resize(mm);
  // Scratch outputs written (first touch) here, not in the first timed run.
  a_out_.assign(mm, 0.0f);
  aa_out_.assign(mm, 0.0f);
  x_out_.assign(mn, 0.0f);

  std::mt19937 gen(12345);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  double sq = 0.0;
  for (auto& v : x_) {
    v = dist(gen);
    sq += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / std::sqrt(sq));
  for (auto& v : x_) v *= inv;
  const int M = static_cast<int>(m_), N = static_cast<int>(n_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, M, N, 1.0f, x_.data(), N, x_.data(), N,
              0.0f, a_.data(), M);
  b_ = a_;  // B = b A + c A A with Keller's (b, c)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 2.0315f, a_.data(), M, a_.data(),
              M, -4.7750f, b_.data(), M);
}

void CpuGemmReference::run(int steps) {
  const int M = static_cast<int>(m_), N = static_cast<int>(n_);
  if (steps < 0) steps = steps_;
  for (int s = 0; s < steps; ++s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, M, N, 1.0f, x_.data(), N, x_.data(), N,
                0.0f, a_out_.data(), M);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, a_.data(), M, a_.data(),
                M, 0.0f, aa_out_.data(), M);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, M, 1.0f, b_.data(), M, x_.data(),
                N, 0.0f, x_out_.data(), N);
  }
}

std::string openblas_description() {
  return std::string(openblas_get_config()) + "; core " + openblas_get_corename() + "; threads " +
         std::to_string(openblas_get_num_threads());
}

}  // namespace muon::bench
