// daemon/numeric_health on matrices whose answer is known: an exactly orthogonal matrix (error 0,
// whatever the scale and orientation), a matrix with known singular values, non-finite values
// counted and left out, the auto threshold of the Keller schedule; and the step_report message's
// validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "daemon/numeric_health.hpp"
#include "kernels/scale_rule.hpp"
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

}  // namespace

TEST(NumericHealth, OrthogonalMatrixHasZeroErrorAtAnyScaleAndOrientation) {
  std::vector<float> gram;
  OrthogonalizeOptions o;  // scale keller, extra_scale 1
  // Wide 8 x 20: scale max(1, 8/20)^0.5 = 1.
  auto w = scaled_partial_identity(8, 20, 1.0f, false);
  auto h = measure_numeric_health(w.data(), {1, 8, 20}, o, gram);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);
  EXPECT_EQ(h.nonfinite, 0);
  // Tall 20 x 8 as the server returns it: U = sqrt(20/8) * NS; the error is of U / scale.
  const float f = static_cast<float>(scale_factor(ScaleRule::keller, 20, 8));
  auto t = scaled_partial_identity(8, 20, f, true);
  h = measure_numeric_health(t.data(), {1, 20, 8}, o, gram);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);
  // extra_scale enters the factor too.
  o.extra_scale = 0.5;
  auto e = scaled_partial_identity(8, 20, 0.5f, false);
  h = measure_numeric_health(e.data(), {1, 8, 20}, o, gram);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);
}

TEST(NumericHealth, KnownSingularValuesGiveTheRmsOfTheirSquaresMinusOne) {
  // diag(0.5, 1, 1, 1) padded to 4 x 6: error = sqrt(((0.25 - 1)^2) / 4) = 0.375.
  std::vector<float> x(24, 0.0f);
  x[0 * 6 + 0] = 0.5f;
  x[1 * 6 + 1] = 1.0f;
  x[2 * 6 + 2] = 1.0f;
  x[3 * 6 + 3] = 1.0f;
  std::vector<float> gram;
  const auto h = measure_numeric_health(x.data(), {1, 4, 6}, OrthogonalizeOptions{}, gram);
  EXPECT_NEAR(h.orthogonality_error, 0.375, 1e-6);
}

TEST(NumericHealth, WorstMatrixOfABatchAndRowBlocksCount) {
  // Two 2 x 4 matrices: the first orthonormal, the second with singular values (1, 0): 0.7071.
  std::vector<float> x(16, 0.0f);
  x[0] = 1.0f;
  x[5] = 1.0f;
  x[8 + 0] = 1.0f;
  std::vector<float> gram;
  auto h = measure_numeric_health(x.data(), {2, 2, 4}, OrthogonalizeOptions{}, gram);
  EXPECT_NEAR(h.orthogonality_error, std::sqrt(0.5), 1e-6);
  // The same values as one 4 x 4 matrix split into row blocks {2, 2}: blocks are measured apart
  // (each 2 x 4, scale 1).
  OrthogonalizeOptions split;
  split.row_splits = {2, 2};
  h = measure_numeric_health(x.data(), {1, 4, 4}, split, gram);
  EXPECT_NEAR(h.orthogonality_error, std::sqrt(0.5), 1e-6);
}

TEST(NumericHealth, NonFiniteValuesAreCountedAndTheirBlockLeftOut) {
  std::vector<float> x(16, 0.0f);
  x[0] = 1.0f;
  x[5] = 1.0f;
  x[8] = std::numeric_limits<float>::quiet_NaN();
  x[9] = std::numeric_limits<float>::infinity();
  std::vector<float> gram;
  auto h = measure_numeric_health(x.data(), {2, 2, 4}, OrthogonalizeOptions{}, gram);
  EXPECT_EQ(h.nonfinite, 2);
  EXPECT_NEAR(h.orthogonality_error, 0.0, 1e-6);  // only the finite first matrix
  h = measure_numeric_health(x.data() + 8, {1, 2, 4}, OrthogonalizeOptions{}, gram);
  EXPECT_EQ(h.nonfinite, 2);
  EXPECT_TRUE(std::isnan(h.orthogonality_error));
}

TEST(NumericHealth, AutoThresholdOfKellerIsTheEdgeOfItsBand) {
  OrthogonalizeOptions o;  // keller, 5 steps: singular values land in [0.682, 1.134]
  EXPECT_NEAR(default_health_threshold(o), 1.0 - 0.6818 * 0.6818, 1e-3);
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
