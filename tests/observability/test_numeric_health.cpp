// daemon/numeric_health on matrices whose answer is known: an exactly orthogonal matrix (error 0,
// whatever the scale and orientation), a matrix with known singular values, non-finite values
// counted and left out, the band threshold of the Keller schedule; the expected error from the
// input's spectrum (quiet on healthy updates whose error is far above the band, loud on planted
// faults); and the step_report message's validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "daemon/numeric_health.hpp"
#include "kernels/backend.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/scale_rule.hpp"
#include "kernels/svd_oracle.hpp"
#include "transport/messages.hpp"

using namespace muon;
using namespace muon::daemon;

namespace {

// rows x cols with orthonormal rows (rows <= cols): a permutation-like 0/1 pattern times `f`;
// transposed when `tall`.
std::vector<float> scaled_partial_identity(int64_t m, int64_t k, float f, bool tall) {
  std::vector<float> x(static_cast<size_t>(m * k), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t j = (i * 7) % k;  // distinct columns while m <= k / gcd: 7 is prime to k here
    if (tall) {
      x[j * m + i] = f;
    } else {
      x[i * k + j] = f;
    }
  }
  return x;
}

// The measurement without the input (the band threshold).
NumericHealth measure(const float* x, const MatrixShape& shape, const OrthogonalizeOptions& o) {
  static HealthScratch scratch;
  return measure_numeric_health(x, shape, o, Precision::fp32, nullptr, scratch);
}

}  // namespace

TEST(NumericHealth, OrthogonalMatrixHasZeroErrorAtAnyScaleAndOrientation) {
  OrthogonalizeOptions o;  // scale keller, extra_scale 1
  // Wide 8 x 20: scale max(1, 8/20)^0.5 = 1.
  auto w = scaled_partial_identity(8, 20, 1.0f, false);
  auto h = measure(w.data(), {1, 8, 20}, o);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);
  EXPECT_EQ(h.nonfinite, 0);
  // Tall 20 x 8 as the server returns it: U = sqrt(20/8) * NS; the error is of U / scale.
  const float f = static_cast<float>(scale_factor(ScaleRule::keller, 20, 8));
  auto t = scaled_partial_identity(8, 20, f, true);
  h = measure(t.data(), {1, 20, 8}, o);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);
  // extra_scale enters the factor too.
  o.extra_scale = 0.5;
  auto e = scaled_partial_identity(8, 20, 0.5f, false);
  h = measure(e.data(), {1, 8, 20}, o);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);
}

TEST(NumericHealth, KnownSingularValuesGiveTheRmsOfTheirSquaresMinusOne) {
  // diag(0.5, 1, 1, 1) padded to 4 x 6: error = sqrt(((0.25 - 1)^2) / 4) = 0.375.
  std::vector<float> x(24, 0.0f);
  x[0 * 6 + 0] = 0.5f;
  x[1 * 6 + 1] = 1.0f;
  x[2 * 6 + 2] = 1.0f;
  x[3 * 6 + 3] = 1.0f;
  const auto h = measure(x.data(), {1, 4, 6}, OrthogonalizeOptions{});
  EXPECT_NEAR(h.orthogonality_error, 0.375, 1e-6);
}

TEST(NumericHealth, WorstMatrixOfABatchAndRowBlocksCount) {
  // Two 2 x 4 matrices: the first orthonormal, the second with singular values (1, 0): 0.7071.
  std::vector<float> x(16, 0.0f);
  x[0] = 1.0f;
  x[5] = 1.0f;
  x[8 + 0] = 1.0f;
  auto h = measure(x.data(), {2, 2, 4}, OrthogonalizeOptions{});
  EXPECT_NEAR(h.orthogonality_error, std::sqrt(0.5), 1e-6);
  // The same values as one 4 x 4 matrix split into row blocks {2, 2}: blocks are measured apart
  // (each 2 x 4, scale 1).
  OrthogonalizeOptions split;
  split.row_splits = {2, 2};
  h = measure(x.data(), {1, 4, 4}, split);
  EXPECT_NEAR(h.orthogonality_error, std::sqrt(0.5), 1e-6);
}

TEST(NumericHealth, NonFiniteValuesAreCountedAndTheirBlockLeftOut) {
  std::vector<float> x(16, 0.0f);
  x[0] = 1.0f;
  x[5] = 1.0f;
  x[8] = std::numeric_limits<float>::quiet_NaN();
  x[9] = std::numeric_limits<float>::infinity();
  auto h = measure(x.data(), {2, 2, 4}, OrthogonalizeOptions{});
  EXPECT_EQ(h.nonfinite, 2);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);  // only the finite first matrix
  h = measure(x.data() + 8, {1, 2, 4}, OrthogonalizeOptions{});
  EXPECT_EQ(h.nonfinite, 2);
  EXPECT_TRUE(std::isnan(h.orthogonality_error));
}

TEST(NumericHealth, AutoThresholdOfKellerIsTheEdgeOfItsBand) {
  OrthogonalizeOptions o;  // keller, 5 steps: singular values land in [0.682, 1.134]
  EXPECT_NEAR(default_health_threshold(o), 1.0 - 0.6818 * 0.6818, 1e-3);
}

namespace {

// One Muon step of the CPU backend on `grad` (momentum starting at zero, sum convention,
// Nesterov: what a first step does), and the health of its update judged against its input.
struct Stepped {
  std::vector<float> grad, momentum, update;
  MuonOptions options;
  MatrixShape shape;
};

Stepped cpu_step(std::vector<float> grad, const MatrixShape& shape,
                 const OrthogonalizeOptions& o = {}) {
  static auto backend = make_backend("cpu", BackendConfig{});
  Stepped st;
  st.grad = std::move(grad);
  st.shape = shape;
  st.options.orthogonalize = o;
  st.momentum.assign(st.grad.size(), 0.0f);
  st.update.resize(st.grad.size());
  backend->muon_update("w", shape, st.grad.data(), st.momentum.data(), st.update.data(),
                       st.options);
  return st;
}

NumericHealth judged(const Stepped& st, const std::vector<float>& update) {
  static HealthScratch scratch;
  HealthInput in{st.grad.data(), st.momentum.data(), st.options.momentum};
  return measure_numeric_health(update.data(), st.shape, st.options.orthogonalize, Precision::fp32,
                                &in, scratch);
}

}  // namespace

TEST(NumericHealth, ExpectedErrorIsTheSchedulesMapOverTheInputSpectrum) {
  // Singular values log-uniform in [1e-4, 1]: f maps them exactly (the SVD oracle tests say so),
  // so the expected error is the RMS of f(s_i)^2 - 1 over the known s_i.
  const int rows = 48, cols = 96;
  const auto g = muon::testing::matrix_with_spectrum(rows, cols, 1e-4, 7);
  std::vector<double> s(rows);
  // The helper's spectrum, normalized by the Frobenius norm as Newton-Schulz does.
  double norm_sq = 0;
  for (int i = 0; i < rows; ++i) {
    s[i] = std::exp(std::log(1e-4) * i / (rows - 1));
    norm_sq += s[i] * s[i];
  }
  for (auto& x : s) x /= std::sqrt(norm_sq) + 1e-7;
  OrthogonalizeOptions o;
  const double expected = expected_orthogonality_error(o, s);
  // Convention none: the gradient is the Newton-Schulz input itself.
  static auto backend = make_backend("cpu", BackendConfig{});
  MuonOptions none;
  none.momentum.convention = MomentumConvention::none;
  std::vector<float> u(g.size());
  backend->muon_update("w", {1, rows, cols}, g.data(), nullptr, u.data(), none);
  HealthScratch scratch;
  const HealthInput in{g.data(), nullptr, none.momentum};
  const auto h =
      measure_numeric_health(u.data(), {1, rows, cols}, o, Precision::fp32, &in, scratch);
  EXPECT_NEAR(h.expected_error, expected, 1e-6);
  EXPECT_NEAR(h.orthogonality_error, expected, 1e-3);             // fp32 lands on the promise
  EXPECT_GT(h.orthogonality_error, default_health_threshold(o));  // the band would cry wolf
  EXPECT_FALSE(h.unhealthy());
  EXPECT_DOUBLE_EQ(h.threshold, h.expected_error + health_tolerance(o, Precision::fp32));
}

TEST(NumericHealth, QuietOnHealthyFirstStepsWhoseErrorIsAboveTheBand) {
  // First-step gradients of small models: Gaussian (a square one has singular values down to
  // ~1/n of its norm), low rank plus noise (what a batch of few tokens gives), fused QKV blocks,
  // an expert batch, tall matrices; every schedule the server offers.
  std::vector<std::pair<MatrixShape, std::vector<float>>> grads;
  grads.push_back({{1, 128, 128}, muon::testing::gaussian(128 * 128, 1)});
  grads.push_back({{1, 512, 128}, muon::testing::gaussian(512 * 128, 2)});
  std::vector<float> low_rank(128 * 384, 0.0f);
  const auto a = muon::testing::gaussian(128 * 4, 3), b = muon::testing::gaussian(4 * 384, 4);
  const auto noise = muon::testing::gaussian(128 * 384, 5, 1e-3f);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 384; ++j) {
      float v = noise[i * 384 + j];
      for (int r = 0; r < 4; ++r) v += a[i * 4 + r] * b[r * 384 + j];
      low_rank[i * 384 + j] = v;
    }
  grads.push_back({{1, 128, 384}, low_rank});
  grads.push_back({{4, 64, 96}, muon::testing::gaussian(4 * 64 * 96, 6)});
  int above_band = 0;
  for (const char* schedule : {"keller", "polar_express", "you", "cans", "deepseek_v4"}) {
    for (const auto& [shape, g] : grads) {
      SCOPED_TRACE(std::string(schedule) + " " + shape.str());
      OrthogonalizeOptions o;
      o.schedule = schedule;
      const Stepped st = cpu_step(g, shape, o);
      const auto h = judged(st, st.update);
      EXPECT_FALSE(h.unhealthy()) << "error " << h.orthogonality_error << ", expected "
                                  << h.expected_error << ", threshold " << h.threshold;
      EXPECT_NEAR(h.orthogonality_error, h.expected_error, 5e-3);
      above_band += h.orthogonality_error > default_health_threshold(o) ? 1 : 0;
    }
  }
  EXPECT_GT(above_band, 0);  // the old fixed threshold would have warned on these
  // Fused QKV: each row block judged against its own input.
  OrthogonalizeOptions qkv;
  qkv.row_splits = {64, 32, 32};
  const Stepped st = cpu_step(muon::testing::gaussian(128 * 96, 8), {1, 128, 96}, qkv);
  EXPECT_FALSE(judged(st, st.update).unhealthy());
}

TEST(NumericHealth, LoudOnPlantedFaults) {
  const MatrixShape shape{1, 128, 384};
  const Stepped st = cpu_step(muon::testing::gaussian(128 * 384, 11), shape);
  ASSERT_FALSE(judged(st, st.update).unhealthy());

  // An update at half (or twice) its size: a lost scale factor.
  for (float f : {0.5f, 2.0f}) {
    auto u = st.update;
    for (auto& x : u) x *= f;
    const auto h = judged(st, u);
    EXPECT_TRUE(h.unhealthy()) << f << ": error " << h.orthogonality_error << " threshold "
                               << h.threshold;
  }
  // Newton-Schulz skipped: the normalized input returned as the update.
  {
    std::vector<float> u(st.grad.size());
    double norm = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      u[i] = st.grad[i] + 0.95f * st.momentum[i];
      norm += static_cast<double>(u[i]) * u[i];
    }
    for (auto& x : u) x = static_cast<float>(x / std::sqrt(norm));
    EXPECT_TRUE(judged(st, u).unhealthy());
  }
  // Too few steps (a schedule cut short): computed with 2 steps, judged as keller's 5.
  {
    OrthogonalizeOptions two;
    two.steps = 2;
    const Stepped short_run = cpu_step(st.grad, shape, two);
    const auto h = judged(st, short_run.update);
    EXPECT_TRUE(h.unhealthy()) << "error " << h.orthogonality_error << " threshold " << h.threshold;
  }
  // One corrupted row (a torn write of 1/128 of the matrix).
  {
    auto u = st.update;
    for (int j = 0; j < 384; ++j) u[5 * 384 + j] *= 8.0f;
    EXPECT_TRUE(judged(st, u).unhealthy());
  }
  // NaN.
  {
    auto u = st.update;
    u[17] = std::numeric_limits<float>::quiet_NaN();
    const auto h = judged(st, u);
    EXPECT_EQ(h.nonfinite, 1);
    EXPECT_TRUE(h.unhealthy());
  }
}

TEST(StepReportMessage, RoundTripsAndRefusesNegativeFigures) {
  transport::StepReport r{12, 3456789, 4096, 4, "fc1.weight"};
  const auto back = transport::decode<transport::StepReport>(transport::encode(r));
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.exposed_wait_ns, 3456789);
  EXPECT_EQ(back.bytes_pushed, 4096);
  EXPECT_EQ(back.parameters, 4);
  EXPECT_EQ(back.slowest_parameter, "fc1.weight");
  // parameters and slowest_parameter are optional.
  const auto minimal = transport::decode<transport::StepReport>(
      R"({"step": 0, "exposed_wait_ns": 0, "bytes_pushed": 0})");
  EXPECT_EQ(minimal.parameters, 0);
  EXPECT_EQ(minimal.slowest_parameter, "");
  EXPECT_THROW(transport::decode<transport::StepReport>(
                   R"({"step": 0, "exposed_wait_ns": -1, "bytes_pushed": 0})"),
               transport::ProtocolError);
  EXPECT_THROW(transport::decode<transport::StepReport>(R"({"step": 0, "bytes_pushed": 0})"),
               transport::ProtocolError);
  EXPECT_EQ(
      transport::message_type_name(static_cast<uint16_t>(transport::MessageType::step_report)),
      "step_report");
}
