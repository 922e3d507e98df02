#include "kernels/backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <random>
#include <string>

#include "core/error.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/ns_choice.hpp"

namespace muon {
namespace {

// dst (cols x rows) = factor * src^T, src rows x cols, row-major, not overlapping; in 32 x 32
// tiles so that both sides stay in cache (a plain double loop strides one side by a whole row per
// element), each tile written a dst row at a time: for 3072 x 768 in, the other order (a src row
// at a time, writes 3072 floats apart: the same few cache sets) took 7.3 ms, this one 1.8 ms.
void transpose_scaled(const float* __restrict src, float* __restrict dst, int64_t rows,
                      int64_t cols, float factor) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = factor * src[i * cols + j];
    }
  }
}

// Calibration of NsAlgorithm::automatic: each candidate's time for one m x n block of Gaussian
// values (fixed seed), ns_paired_times over kNsCalibrationRounds rounds after a warm-up round
// (workspaces, thread pools); every round runs each candidate once, in reverse order every other
// round so that load drifting during a round favours none. Blocks above kNsTimedFlops are not
// timed (ns_model_flops decides). Batching's times are the least of kRounds rounds.
constexpr int kRounds = 3;

double nominal_flops(int64_t m, int64_t n, size_t steps) {
  return static_cast<double>(steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

// CPU seconds of every thread of this process (CLOCK_PROCESS_CPUTIME_ID): over a wall interval,
// how many cores its threads actually ran on.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<float> calibration_input(int64_t count, int64_t m, int64_t n) {
  std::mt19937 gen(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> input(static_cast<size_t>(count * m * n));
  for (auto& v : input) v = normal(gen);
  return input;
}

// Batching's calibration: `width` matrices, and a lone one, one at a time and side by side
// (run(side_by_side, count, x)), each the least of kRounds interleaved rounds after a warm-up of
// all four (the side-by-side threads' workspaces).
template <class Run>
NsBatchMeasurement measure_batching(int width, int64_t m, int64_t n, Run&& run) {
  const std::vector<float> input = calibration_input(width, m, n);
  std::vector<float> x(input.size());
  NsBatchMeasurement out{width, INFINITY, INFINITY, INFINITY, INFINITY};
  double batch_cpu = 0.0, batch_wall = 0.0;  // the side-by-side rounds of `width` matrices
  for (int round = -1; round < kRounds; ++round) {
    for (int count : {width, 1}) {
      for (bool side_by_side : {false, true}) {
        std::copy(input.begin(), input.end(), x.begin());
        const double cpu0 = process_cpu_seconds();
        const auto t = std::chrono::steady_clock::now();
        run(side_by_side, count, x.data());
        const double s = std::max(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(), 1e-9);
        if (round < 0) continue;
        if (side_by_side && count == width) {
          batch_cpu += process_cpu_seconds() - cpu0;
          batch_wall += s;
        }
        double& best = count == 1 ? (side_by_side ? out.lone_one_thread : out.lone_all_threads)
                                  : (side_by_side ? out.side_by_side : out.one_at_a_time);
        best = std::min(best, s);
      }
    }
  }
  out.side_by_side_cores = batch_wall > 0.0 ? batch_cpu / batch_wall : 0.0;
  return out;
}

template <class Run>
std::vector<NsMeasurement> measure_candidates(const std::vector<NsAlgorithm>& candidates,
                                              int64_t m, int64_t n, Run&& run) {
  const std::vector<float> input = calibration_input(1, m, n);
  std::vector<float> x(input.size());
  std::vector<std::vector<double>> rounds;
  for (int round = -1; round < kNsCalibrationRounds; ++round) {
    std::vector<double> times(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) {
      const size_t c = round % 2 == 0 ? i : candidates.size() - 1 - i;
      std::copy(input.begin(), input.end(), x.begin());
      const auto t = std::chrono::steady_clock::now();
      run(candidates[c], x.data());
      times[c] = std::max(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(), 1e-9);
    }
    if (round >= 0) rounds.push_back(std::move(times));
  }
  const std::vector<double> seconds = ns_paired_times(rounds);
  std::vector<NsMeasurement> out;
  for (size_t c = 0; c < candidates.size(); ++c) out.push_back({candidates[c], seconds[c]});
  return out;
}

// Whether no element is NaN or Inf (is_finite_bits for all), as the largest magnitude's bits: a
// max the compiler vectorizes (half the time of and-ing is_finite_bits per element).
bool all_finite(const float* x, int64_t n) {
  int32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= 0x7fffffff;
    largest = bits > largest ? bits : largest;
  }
  return largest < 0x7f800000;
}

}  // namespace

bool Backend::orthogonalize(std::string_view matrix_name, const MatrixShape& shape, const float* in,
                            float* out, const OrthogonalizeOptions& options) {
  validate(options, shape, matrix_name);
  const int64_t n = shape.numel();
  if (!all_finite(in, n)) {
    if (options.nonfinite == NonFinitePolicy::skip) {
      std::fill(out, out + n, 0.0f);
      return false;
    }
    throw NonFiniteError("matrix '" + std::string(matrix_name) + "' " + shape.str() +
                         ": input holds NaN or Inf; step refused");
  }
  const auto coefficients = ns_coefficients(options);
  const auto blocks = row_blocks(options, shape, matrix_name);
  const int64_t c = shape.cols, slice = shape.rows * shape.cols;

  int64_t row0 = 0;
  for (int64_t rb : blocks) {
    // Gather block `rb` of every slice into work_, wide orientation (transpose tall blocks so the
    // Gram matrix is min(rb, c) square).
    const bool tall = rb > c;
    const int64_t m = tall ? c : rb, k = tall ? rb : c, block = rb * c;
    work_.resize(static_cast<size_t>(shape.batch * block));
    for (int64_t b = 0; b < shape.batch; ++b) {
      const float* src = in + b * slice + row0 * c;
      float* dst = work_.data() + b * block;
      if (!tall) {
        std::memcpy(dst, src, sizeof(float) * block);
      } else {
        transpose_scaled(src, dst, rb, c, 1.0f);
      }
    }
    const Resolved run = resolved(options, m, k, coefficients);
    if (run.side_by_side) {
      newton_schulz_side_by_side(work_.data(), shape.batch, m, k, coefficients, run.options);
    } else {
      newton_schulz_batch(work_.data(), shape.batch, m, k, coefficients, run.options);
    }
    const float factor =
        static_cast<float>(options.extra_scale * scale_factor(options.scale_rule, rb, c));
    for (int64_t b = 0; b < shape.batch; ++b) {
      const float* src = work_.data() + b * block;
      float* dst = out + b * slice + row0 * c;
      if (!tall) {
        for (int64_t i = 0; i < block; ++i) dst[i] = factor * src[i];
      } else {
        transpose_scaled(src, dst, c, rb, factor);
      }
    }
    row0 += rb;
  }
  return true;
}

void Backend::prepare(std::string_view matrix_name, const MatrixShape& shape,
                      const OrthogonalizeOptions& options) {
  validate(options, shape, matrix_name);
  if (options.algorithm != NsAlgorithm::automatic) return;
  const auto coefficients = ns_coefficients(options);
  for (int64_t rb : row_blocks(options, shape, matrix_name)) {
    resolved(options, std::min(rb, shape.cols), std::max(rb, shape.cols), coefficients);
  }
}

Backend::Resolved Backend::resolved(const OrthogonalizeOptions& options, int64_t m, int64_t n,
                                   const std::vector<NsCoefficients>& coefficients) {
  if (options.algorithm != NsAlgorithm::automatic) return {options, false};
  OrthogonalizeOptions o = options;
  const Precision precision =
      o.precision == Precision::backend_default ? default_precision() : o.precision;
  const auto candidates = ns_auto_candidates(name(), precision, o.gram_restart);
  if (candidates.size() == 1) {
    o.algorithm = candidates.front();
    return {o, false};
  }
  const std::string key =
      ns_choice_key(precision, m, n, static_cast<int>(coefficients.size()), o.gram_restart);
  const bool heavy = nominal_flops(m, n, coefficients.size()) > kNsTimedFlops;
  auto measure = [&] {
    if (heavy) {
      std::vector<NsMeasurement> model;
      for (NsAlgorithm a : candidates) {
        model.push_back({a,
                         ns_model_flops(a, m, n, static_cast<int>(coefficients.size()),
                                        o.gram_restart),
                         true});
      }
      return model;
    }
    return measure_candidates(candidates, m, n, [&](NsAlgorithm a, float* x) {
      OrthogonalizeOptions run = o;
      run.algorithm = a;
      newton_schulz_batch(x, 1, m, n, coefficients, run);
    });
  };
  auto measure_batch = [&](NsAlgorithm a,
                           std::string& why_not) -> std::optional<NsBatchMeasurement> {
    const int width = side_by_side_width();
    if (width < 2) {
      why_not = "one BLAS thread here (nothing to run side by side)";
      return std::nullopt;
    }
    if (heavy) {
      why_not = "a block this heavy keeps every core busy on its own (not timed above " +
                std::to_string(static_cast<int>(kNsTimedFlops / 1e9)) + " GFLOP)";
      return std::nullopt;
    }
    OrthogonalizeOptions run = o;
    run.algorithm = a;
    return measure_batching(width, m, n, [&](bool side_by_side, int count, float* x) {
      if (side_by_side) {
        newton_schulz_side_by_side(x, count, m, n, coefficients, run);
      } else {
        newton_schulz_batch(x, count, m, n, coefficients, run);
      }
    });
  };
  const NsChoice c =
      NsChoiceTable::process().choose(machine_key(), key, measure, measure_batch);
  o.algorithm = c.algorithm;
  return {o, c.side_by_side};
}

bool Backend::muon_update(std::string_view matrix_name, const MatrixShape& shape, const float* grad,
                          float* momentum, float* update, const MuonOptions& options) {
  validate(options, shape, matrix_name);
  const int64_t n = shape.numel();
  const auto& mo = options.momentum;
  if (!all_finite(grad, n)) {
    if (options.orthogonalize.nonfinite == NonFinitePolicy::skip) {
      std::fill(update, update + n, 0.0f);
      return false;
    }
    throw NonFiniteError("matrix '" + std::string(matrix_name) + "' " + shape.str() +
                         ": gradient holds NaN or Inf; step refused, momentum untouched");
  }
  if (mo.convention == MomentumConvention::none) {
    return orthogonalize(matrix_name, shape, grad, update, options.orthogonalize);
  }
  if (momentum == nullptr) {
    throw InvalidArgument("matrix '" + std::string(matrix_name) +
                          "': momentum buffer is null but the convention keeps momentum");
  }
  const MomentumCoefficients k = momentum_coefficients(mo.mu);
  for (int64_t i = 0; i < n; ++i) {
    const float m = momentum_step(mo.convention, momentum[i], grad[i], k);
    momentum[i] = m;
    update[i] = orthogonalize_input(mo.convention, mo.nesterov, m, grad[i], k);
  }
  return orthogonalize(matrix_name, shape, update, update, options.orthogonalize);
}

}  // namespace muon
