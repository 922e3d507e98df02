#include "kernels/cpu_backend.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "kernels/blas_threads.hpp"
#include "transport/bf16.hpp"

namespace muon {
namespace {

// x as a bf16 tensor holds it: rounded to nearest even (torch's .to(torch.bfloat16)), in fp32.
float round_to_bf16(float x) { return transport::bf16_to_f32(transport::f32_to_bf16(x)); }

void narrow_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

// torch.optim.Muon's normalization on a bf16 tensor X (already narrowed): X.norm() accumulates
// in fp32 and rounds to bf16; the guard per eps mode in bf16 (clamp(min=eps): eps as bf16;
// add: the float sum rounded to bf16); 0 for an all-zero X.
float torch_bf16_divisor(const float* x, int64_t n, float eps, EpsMode mode) {
  const float norm = round_to_bf16(static_cast<float>(frobenius_norm(x, n)));
  if (norm == 0.0f) return 0.0f;
  switch (mode) {
    case EpsMode::clamp:
      return std::max(norm, round_to_bf16(eps));
    case EpsMode::add:
      return round_to_bf16(norm + eps);
    case EpsMode::scale_invariant:
      break;
  }
  return norm;
}

// Copy the upper triangle of a row-major m x m matrix onto its lower triangle. ssyrk writes one
// triangle only; the full matrix then feeds sgemm. In 32 x 32 tiles: the plain double loop reads
// the upper triangle a column at a time, one cache line per element (for m = 768 it took about
// 8 % of a syrk Newton-Schulz run; tiled, under 1 %). A copy: the bits are the same either way.
void mirror_upper(float* s, int64_t m) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < m; i0 += kTile) {
    const int64_t i1 = std::min(m, i0 + kTile);
    for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
      const int64_t j1 = std::min(m, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t jend = std::min(j1, i);
        for (int64_t j = j0; j < jend; ++j) s[i * m + j] = s[j * m + i];
      }
    }
  }
}

// dst's upper triangle (diagonal included) = src's, row-major m x m: what ssyrk reads of its C
// (half the bytes of a full copy).
void copy_upper(const float* src, float* dst, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(dst + i * m + i, src + i * m + i, sizeof(float) * static_cast<size_t>(m - i));
  }
}

// Of x (the result) and the workspace's x2 (the two buffers X alternates between), the one
// `cur` is not.
float* other_of(const float* cur, float* x, float* x2) { return cur == x ? x2 : x; }

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

double frobenius_norm(const float* x, int64_t n) {
  // kLanes partial sums (element i into sum i % kLanes), added in lane order at the end: a fixed
  // order (deterministic), and independent chains the compiler vectorizes where one running sum
  // waits on each addition's latency (about 2 % of a Gram Newton-Schulz run at 768 x 2304).
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(x[i + l]) * x[i + l];
  }
  for (; i < n; ++i) lane[i % kLanes] += static_cast<double>(x[i]) * x[i];
  double s = 0.0;
  for (double v : lane) s += v;
  return std::sqrt(s);
}

CpuBackend::CpuBackend(const BackendConfig& config) {
  if (config.cpu_threads > 0) openblas_set_num_threads(config.cpu_threads);
}

std::string CpuBackend::machine_key() const {
  // The fixed part once per process (reading /proc/cpuinfo per call would cost more than a small
  // Newton-Schulz); the thread count as it is now (the in-process reference sets it per update).
  static const std::string fixed = [] {
    std::string model = "unknown";
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos && colon + 2 <= line.size()) model = line.substr(colon + 2);
        break;
      }
    }
    return "cpu " + model + " x" + std::to_string(std::thread::hardware_concurrency()) +
           " openblas " + openblas_get_config();
  }();
  return fixed + " threads=" + std::to_string(openblas_get_num_threads());
}

int CpuBackend::side_by_side_width() const { return std::max(1, openblas_get_num_threads()); }

namespace {

void check_cpu_options(const OrthogonalizeOptions& options) {
  if (options.precision == Precision::bf16) {
    throw InvalidArgument(
        "the CPU backend computes in fp32 (or torch_bf16, emulated); bf16 products need "
        "--backend cuda");
  }
  if (options.algorithm == NsAlgorithm::automatic) {
    throw InvalidArgument("the CPU backend runs plain, syrk or gram; resolve auto first");
  }
}

}  // namespace

void CpuBackend::newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                                     const std::vector<NsCoefficients>& coefficients,
                                     const OrthogonalizeOptions& options) {
  check_cpu_options(options);
  for (int64_t i = 0; i < count; ++i) {
    one_matrix(work_[0], x + i * rows * cols, rows, cols, coefficients, options);
  }
}

void CpuBackend::newton_schulz_side_by_side(float* x, int64_t count, int64_t rows, int64_t cols,
                                            const std::vector<NsCoefficients>& coefficients,
                                            const OrthogonalizeOptions& options) {
  check_cpu_options(options);
  const int width = side_by_side_width();
  const int threads = static_cast<int>(std::min<int64_t>(width, count));
  if (static_cast<int>(work_.size()) < threads) work_.resize(static_cast<size_t>(threads));
  ScopedBlasThreads one(1);  // OpenBLAS runs each call on the thread that makes it
  std::atomic<int64_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
  auto worker = [&](Workspace& w) {
    try {
      for (int64_t i; (i = next.fetch_add(1)) < count;) {
        one_matrix(w, x + i * rows * cols, rows, cols, coefficients, options);
      }
    } catch (...) {
      std::lock_guard lock(error_mu);
      if (!error) error = std::current_exception();
      next = count;  // the others stop after their matrix
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(worker, std::ref(work_[t]));
  worker(work_[0]);
  for (auto& h : helpers) h.join();
  if (error) std::rethrow_exception(error);
}

// One matrix of a batch: normalized per options.eps_mode (torch_bf16: as torch does it in bf16),
// then the algorithm's steps. The products write X alternately into xi and the workspace; the
// normalized X starts in the workspace when they write it an odd number of times, so the result
// lands in xi without a copy back (the same arithmetic either way: the same bits).
void CpuBackend::one_matrix(Workspace& w, float* xi, int64_t rows, int64_t cols,
                            const std::vector<NsCoefficients>& coefficients,
                            const OrthogonalizeOptions& options) {
  const int64_t size = rows * cols;
  grow(w.x2, size);
  if (options.precision == Precision::torch_bf16) {  // validate(): algorithm plain
    narrow_to_bf16(xi, size);  // grad.to(torch.bfloat16)
    const float denom = torch_bf16_divisor(xi, size, options.eps, options.eps_mode);
    if (denom == 0.0f) return;  // exact zeros stay zeros
    float* start = coefficients.size() % 2 == 1 ? w.x2.data() : xi;
    for (int64_t j = 0; j < size; ++j) start[j] = round_to_bf16(xi[j] / denom);  // bf16 div_
    plain(w, start, xi, rows, cols, coefficients, true);
    return;
  }
  const double denom =
      normalization_divisor(frobenius_norm(xi, size), options.eps, options.eps_mode);
  if (denom == 0.0) return;  // exact zeros in, exact zeros out (never 0/0)
  const NsAlgorithm algo = options.algorithm;
  const size_t writes =
      algo == NsAlgorithm::gram ? gram_run_lengths(coefficients.size(), options.gram_restart).size()
                                : coefficients.size();
  float* start = writes % 2 == 1 ? w.x2.data() : xi;
  // In double, rounded once: bitwise the float division for a float divisor, and no overflow
  // of a norm beyond float's range in scale_invariant mode.
  for (int64_t j = 0; j < size; ++j) start[j] = static_cast<float>(xi[j] / denom);
  switch (algo) {
    case NsAlgorithm::gram:
      gram(w, start, xi, rows, cols, coefficients, options.gram_restart);
      break;
    case NsAlgorithm::syrk:
      syrk(w, start, xi, rows, cols, coefficients);
      break;
    case NsAlgorithm::plain:
    case NsAlgorithm::automatic:  // check_cpu_options refused it
      plain(w, start, xi, rows, cols, coefficients, false);
      break;
  }
}

// Per step, X wide m x n row-major:  A = X X^T;  B = b A + c A A;  X <- a X + B X.
// narrow: each product's fp32 result rounded to bf16 (torch's bf16 matmul and addmm).
// Starts from `in` (x or w.x2); the result ends in x.
void CpuBackend::plain(Workspace& w, float* in, float* x, int64_t m, int64_t n,
                       const std::vector<NsCoefficients>& coeffs, bool narrow) {
  grow(w.a, m * m);
  grow(w.b, m * m);
  float* A = w.a.data();
  float* B = w.b.data();
  float* cur = in;
  const int M = static_cast<int>(m), N = static_cast<int>(n);
  for (const auto& k : coeffs) {
    const float a = static_cast<float>(k.a), b = static_cast<float>(k.b),
                c = static_cast<float>(k.c);
    float* next = other_of(cur, x, w.x2.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, M, N, 1.0f, cur, N, cur, N, 0.0f, A,
                M);
    if (narrow) narrow_to_bf16(A, m * m);
    std::memcpy(B, A, sizeof(float) * m * m);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, c, A, M, A, M, b, B, M);
    if (narrow) narrow_to_bf16(B, m * m);
    std::memcpy(next, cur, sizeof(float) * m * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, M, 1.0f, B, M, cur, N, a, next, N);
    if (narrow) narrow_to_bf16(next, m * n);
    cur = next;
  }
  if (cur != x) std::memcpy(x, cur, sizeof(float) * m * n);
}

// The same polynomial with the symmetric products (A and B are symmetric), per step:
//   A = X X^T             ssyrk, upper triangle (half of sgemm's flops), mirrored: the next
//                         product reads all of A
//   B = a I + b A + c A A  one ssyrk on the upper triangle (C preloaded with A's upper triangle,
//                         beta = b, alpha = c), then a added on the diagonal
//   X <- B X              ssymm reading B's upper triangle
// so X is not copied for the axpy (a X is folded into B) and B is never mirrored: besides the
// products, a step makes two passes over the m x m triangle (mirror A, copy it into B) where
// the form before 2026-12-02 made two mirrors, a full copy of A and a copy of X (about 4 % of a
// 768 x 768 step on one thread by the time of each call; the whole runs' difference was within
// the noise of a loaded machine: bench/README.md).
void CpuBackend::syrk(Workspace& w, float* in, float* x, int64_t m, int64_t n,
                      const std::vector<NsCoefficients>& coeffs) {
  grow(w.a, m * m);
  grow(w.b, m * m);
  float* A = w.a.data();
  float* B = w.b.data();
  float* cur = in;
  const int M = static_cast<int>(m), N = static_cast<int>(n);
  for (const auto& k : coeffs) {
    const float a = static_cast<float>(k.a), b = static_cast<float>(k.b),
                c = static_cast<float>(k.c);
    float* next = other_of(cur, x, w.x2.data());
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, M, N, 1.0f, cur, N, 0.0f, A, M);
    mirror_upper(A, m);
    copy_upper(A, B, m);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, M, M, c, A, M, b, B, M);
    for (int64_t i = 0; i < m; ++i) B[i * m + i] += a;
    cblas_ssymm(CblasRowMajor, CblasLeft, CblasUpper, M, N, 1.0f, B, M, cur, N, 0.0f, next, N);
    cur = next;
  }
  if (cur != x) std::memcpy(x, cur, sizeof(float) * m * n);
}


// Gram-space iteration (Zhang, Amsel, Chen, Dao 2025, Dao-AILab/gram-newton-schulz). With
// X_k = Q_k X_0 and R_k = X_k X_k^T, one step X_{k+1} = P_k X_k with P_k = a I + b R_k + c R_k^2
// gives
//   Q_{k+1} = P_k Q_k,   R_{k+1} = P_k R_k P_k  (P_k is a polynomial in R_k: symmetric, commuting),
// so only m x m products run per step and X = Q X_0 is formed at the end of a run of steps.
// (R_k P_k^2, one ssyrk and one sgemm instead of two sgemms, was measured: up to 2.1x plain's
// error from the SVD oracle, against 1.5x for P_k R_k P_k: outside the exactness contract.)
// Restart (the source's stabilization): the steps run in runs (gram_run_lengths: `restart`
// steps each, a lone last step joining the run before it); each run starts from the X the
// previous one formed, with R recomputed from it, so rounding in Q and R (R carries the squared
// condition number of X) accumulates over one run only.
// The runs write X alternately to x and to the workspace, starting from `in` (x or w.x2; the
// result ends in x).
void CpuBackend::gram(Workspace& w, float* in, float* x, int64_t m, int64_t n,
                      const std::vector<NsCoefficients>& coeffs, int restart) {
  float* cur = in;
  size_t first = 0;
  for (const size_t len : gram_run_lengths(coeffs.size(), restart)) {
    float* next = other_of(cur, x, w.x2.data());
    gram_run(w, cur, next, m, n, coeffs.data() + first, len);
    cur = next;
    first += len;
  }
  if (cur != x) std::memcpy(x, cur, sizeof(float) * m * n);
}

// One run of `count` Gram-space steps from X (m x n, `in`): R = X X^T, the steps on R and Q,
// then out <- Q X.
void CpuBackend::gram_run(Workspace& w, const float* in, float* out, int64_t m, int64_t n,
                          const NsCoefficients* coeffs, size_t count) {
  grow(w.a, m * m);  // R
  grow(w.b, m * m);  // P
  grow(w.q, m * m);  // Q
  grow(w.t, m * m);  // scratch
  float* R = w.a.data();
  float* P = w.b.data();
  float* Q = w.q.data();
  float* T = w.t.data();
  const int M = static_cast<int>(m), N = static_cast<int>(n);
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, M, N, 1.0f, in, N, 0.0f, R, M);
  mirror_upper(R, m);
  for (size_t s = 0; s < count; ++s) {
    const float a = static_cast<float>(coeffs[s].a), b = static_cast<float>(coeffs[s].b),
                c = static_cast<float>(coeffs[s].c);
    // P = c R R + b R + a I (ssyrk reads and writes C's upper triangle only)
    copy_upper(R, P, m);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, M, M, c, R, M, b, P, M);
    mirror_upper(P, m);
    for (int64_t i = 0; i < m; ++i) P[i * m + i] += a;
    if (s == 0) {
      std::memcpy(Q, P, sizeof(float) * m * m);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, P, M, Q, M, 0.0f, T, M);
      std::swap(Q, T);
    }
    if (s + 1 < count) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, P, M, R, M, 0.0f, T, M);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, T, M, P, M, 0.0f, R, M);
      mirror_upper(R, m);  // keep R exactly symmetric: ssyrk reads all of it
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, M, 1.0f, Q, M, in, N, 0.0f, out, N);
}

}  // namespace muon
