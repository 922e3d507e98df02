// The CUDA backend against the CPU backend (the oracle): fp32 within 1e-4 and bf16 within 3e-2
// relative Frobenius error, batches, row splits, tall matrices, exact zeros, muon_update, and
// buffer reuse. The factory tests run everywhere; the GPU tests skip with the reason (the
// BackendUnavailable message) where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "svd_oracle.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

OrthogonalizeOptions unscaled(Precision precision, const std::string& schedule = "keller",
                              int steps = 0) {
  OrthogonalizeOptions o;
  o.schedule = schedule;
  o.steps = steps;
  o.scale_rule = ScaleRule::none;
  o.precision = precision;
  return o;
}

// The CPU backend only takes fp32; everything else about the options stays.
OrthogonalizeOptions as_cpu(OrthogonalizeOptions o) {
  o.precision = Precision::fp32;
  return o;
}

// ||a - b||_F / ||b||_F over n floats, in double.
double rel_error(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

constexpr double kFp32Tolerance = 1e-4;
constexpr double kBf16Tolerance = 3e-2;

double tolerance(Precision p) {
  return p == Precision::fp32 ? kFp32Tolerance : kBf16Tolerance;
}


// Creates the CUDA backend for each test, or skips the test with the reason.
class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      cuda_ = make_backend("cuda");
    } catch (const BackendUnavailable& e) {
      GTEST_SKIP() << "CUDA backend unavailable: " << e.what();
    }
    cpu_ = make_backend("cpu");
  }

  // Runs orthogonalize on both backends and returns ||cuda - cpu|| / ||cpu||.
  double compare(const MatrixShape& shape, const std::vector<float>& g,
                 const OrthogonalizeOptions& o) {
    std::vector<float> out_cuda(g.size()), out_cpu(g.size());
    EXPECT_TRUE(cuda_->orthogonalize("w", shape, g.data(), out_cuda.data(), o));
    EXPECT_TRUE(cpu_->orthogonalize("w", shape, g.data(), out_cpu.data(), as_cpu(o)));
    return rel_error(out_cuda.data(), out_cpu.data(), g.size());
  }

  std::unique_ptr<Backend> cuda_, cpu_;
};

}  // namespace

// ---- factory: runs on every machine -------------------------------------------------------

TEST(CudaBackendFactory, CudaEitherWorksOrThrowsBackendUnavailableWithAReason) {
  ASSERT_TRUE(cuda_backend_built());
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend("cuda");
  } catch (const BackendUnavailable& e) {
    EXPECT_FALSE(e.message().empty());
    std::cout << "[   INFO   ] make_backend(\"cuda\"): " << e.what() << "\n";
    return;
  }
  // Any other exception type fails the test (gtest reports it).
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cuda");
  EXPECT_EQ(backend->default_precision(), Precision::bf16);
}

TEST(CudaBackendFactory, AutoAlwaysReturnsABackend) {
  auto backend = make_backend("auto");
  ASSERT_NE(backend, nullptr);
  bool cuda_usable = true;
  try {
    make_backend("cuda");
  } catch (const BackendUnavailable&) {
    cuda_usable = false;
  }
  EXPECT_EQ(backend->name(), cuda_usable ? "cuda" : "cpu");
}

// ---- GPU tests: skip where no GPU is usable -----------------------------------------------

TEST_F(CudaVsCpu, MatchesCpuOnWideTallAndSquareShapes) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (auto [r, c] : {std::pair{64, 96}, std::pair{96, 64}, std::pair{256, 256}}) {
      // Singular values in [1e-2, 1] (bf16 rounding blurs directions far below that) and plain
      // Gaussian input, the shape of a real gradient.
      for (unsigned seed : {1u, 2u}) {
        auto g = seed == 1u ? matrix_with_spectrum(r, c, 1e-2, 40 + r + c)
                            : gaussian(size_t(r) * c, 50 + r + c);
        const double err = compare({1, r, c}, g, unscaled(p));
        EXPECT_LT(err, tolerance(p))
            << precision_name(p) << " " << r << "x" << c << " input " << seed;
      }
    }
  }
}

TEST_F(CudaVsCpu, Fp32MatchesCpuForEverySchedule) {
  const int r = 64, c = 96;
  auto g = matrix_with_spectrum(r, c, 1e-3, 7);
  for (const char* schedule : {"keller", "you", "polar_express", "cans", "deepseek_v4"}) {
    EXPECT_LT(compare({1, r, c}, g, unscaled(Precision::fp32, schedule)), kFp32Tolerance)
        << schedule;
  }
}

TEST_F(CudaVsCpu, Fp32StaysInTheSchedulesBandAgainstTheSvdOracle) {
  const int r = 64, c = 96;
  auto g = matrix_with_spectrum(r, c, 1e-3, 9);
  std::vector<float> out(g.size());
  const auto o = unscaled(Precision::fp32, "polar_express", 8);
  ASSERT_TRUE(cuda_->orthogonalize("w", {1, r, c}, g.data(), out.data(), o));
  const auto coeffs = find_ns_schedule("polar_express").coefficients(8);
  auto [lo, hi] = ns_promised_band(coeffs, 1e-2);
  auto rep = compare_with_oracle(g.data(), out.data(), r, c, coeffs, o.eps, 1e-2);
  EXPECT_LT(rep.rel_error, kFp32Tolerance);
  EXPECT_GE(rep.min_kept, lo - 1e-3);
  EXPECT_LE(rep.max_kept, hi + 1e-3);
}

TEST_F(CudaVsCpu, BatchOfFourMatchesCpuAndEachSliceIsNormalizedAlone) {
  const int b = 4, r = 64, c = 128;
  auto g = gaussian(size_t(b) * r * c, 11);
  for (int k = 0; k < r * c; ++k) g[size_t(2) * r * c + k] *= 1000.0f;  // one loud slice
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    std::vector<float> out_cuda(g.size()), out_cpu(g.size());
    OrthogonalizeOptions o;  // keller scale rule, default schedule
    o.precision = p;
    ASSERT_TRUE(cuda_->orthogonalize("experts", {b, r, c}, g.data(), out_cuda.data(), o));
    ASSERT_TRUE(cpu_->orthogonalize("experts", {b, r, c}, g.data(), out_cpu.data(), as_cpu(o)));
    for (int i = 0; i < b; ++i) {
      const size_t off = size_t(i) * r * c;
      EXPECT_LT(rel_error(out_cuda.data() + off, out_cpu.data() + off, size_t(r) * c), tolerance(p))
          << precision_name(p) << " slice " << i;
    }
  }
}

TEST_F(CudaVsCpu, RowSplitsMatchCpu) {
  const int c = 48;
  auto g = gaussian(size_t(64) * c, 5);
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    OrthogonalizeOptions o;
    o.row_splits = {16, 16, 32};
    o.precision = p;
    EXPECT_LT(compare({1, 64, c}, g, o), tolerance(p)) << precision_name(p);
  }
}

TEST_F(CudaVsCpu, SyrkAndGramRunTheSamePolynomial) {
  const int r = 32, c = 160;
  auto g = matrix_with_spectrum(r, c, 1e-2, 13);
  for (auto algo : {NsAlgorithm::syrk, NsAlgorithm::gram}) {
    auto o = unscaled(Precision::fp32);
    o.algorithm = algo;
    auto plain_cpu = as_cpu(o);
    plain_cpu.algorithm = NsAlgorithm::plain;
    std::vector<float> out_cuda(g.size()), out_cpu(g.size());
    ASSERT_TRUE(cuda_->orthogonalize("w", {1, r, c}, g.data(), out_cuda.data(), o));
    ASSERT_TRUE(cpu_->orthogonalize("w", {1, r, c}, g.data(), out_cpu.data(), plain_cpu));
    EXPECT_LT(rel_error(out_cuda.data(), out_cpu.data(), g.size()), kFp32Tolerance)
        << static_cast<int>(algo);
  }
}

TEST_F(CudaVsCpu, StabilizedGramIsWithinTwiceThePlainErrorInFp32) {
  // The device gram iteration (restart kDefaultGramRestart) against the SVD oracle next to the
  // device plain GEMMs on the same input: square, wide and tall, down to 1e-6 conditioning.
  for (auto [r, c] : {std::pair{64, 64}, std::pair{48, 192}, std::pair{192, 48}}) {
    for (double s_min : {1e-1, 1e-3, 1e-6}) {
      auto g = matrix_with_spectrum(r, c, s_min, 300 + r + c);
      const auto coeffs = find_ns_schedule("keller").coefficients(0);
      std::vector<float> out(g.size());
      auto o = unscaled(Precision::fp32);
      o.algorithm = NsAlgorithm::plain;
      ASSERT_TRUE(cuda_->orthogonalize("w", {1, r, c}, g.data(), out.data(), o));
      const double plain =
          compare_with_oracle(g.data(), out.data(), r, c, coeffs, o.eps, 1e-2).rel_error;
      o.algorithm = NsAlgorithm::gram;
      ASSERT_TRUE(cuda_->orthogonalize("w", {1, r, c}, g.data(), out.data(), o));
      const double gram =
          compare_with_oracle(g.data(), out.data(), r, c, coeffs, o.eps, 1e-2).rel_error;
      EXPECT_LE(gram, 2.0 * plain) << r << "x" << c << " s_min " << s_min;
    }
  }
}

TEST_F(CudaVsCpu, AllZeroInputGivesExactZeros) {
  // Slice 1 of 3 is all zeros: it stays exactly zero while its neighbours are orthogonalized.
  const int b = 3, r = 12, c = 20, n = r * c;
  auto g = gaussian(size_t(b) * n, 17);
  std::fill(g.begin() + n, g.begin() + 2 * n, 0.0f);
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (auto mode : {EpsMode::scale_invariant, EpsMode::add, EpsMode::clamp}) {
      for (float eps : {1e-7f, 0.0f}) {
        OrthogonalizeOptions o;
        o.precision = p;
        o.eps_mode = mode;
        o.eps = eps;
        std::vector<float> z(size_t(n), 0.0f), out(z.size(), 7.0f);
        ASSERT_TRUE(cuda_->orthogonalize("zero", {1, r, c}, z.data(), out.data(), o));
        for (float v : out) ASSERT_EQ(v, 0.0f) << precision_name(p);
        std::vector<float> mixed(g.size(), 7.0f), ref(g.size());
        ASSERT_TRUE(cuda_->orthogonalize("mixed", {b, r, c}, g.data(), mixed.data(), o));
        ASSERT_TRUE(cpu_->orthogonalize("mixed", {b, r, c}, g.data(), ref.data(), as_cpu(o)));
        for (int k = n; k < 2 * n; ++k) ASSERT_EQ(mixed[k], 0.0f) << precision_name(p);
        EXPECT_LT(rel_error(mixed.data(), ref.data(), size_t(n)), tolerance(p));
        EXPECT_LT(rel_error(mixed.data() + 2 * n, ref.data() + 2 * n, size_t(n)), tolerance(p));
      }
    }
  }
}

TEST_F(CudaVsCpu, MuonUpdateAgreesWithCpu) {
  const int r = 48, c = 80, n = r * c;
  for (auto conv : {MomentumConvention::sum, MomentumConvention::ema}) {
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      MuonOptions o;
      o.momentum = {conv, 0.9f, true};
      o.orthogonalize.precision = p;
      auto cpu_options = o;
      cpu_options.orthogonalize.precision = Precision::fp32;
      const auto g = gaussian(n, 21), m0 = gaussian(n, 22);
      auto m_cuda = m0, m_cpu = m0;
      std::vector<float> u_cuda(n), u_cpu(n);
      ASSERT_TRUE(cuda_->muon_update("w", {1, r, c}, g.data(), m_cuda.data(), u_cuda.data(), o));
      ASSERT_TRUE(
          cpu_->muon_update("w", {1, r, c}, g.data(), m_cpu.data(), u_cpu.data(), cpu_options));
      EXPECT_TRUE(bitwise_equal(m_cuda.data(), m_cpu.data(), n));  // momentum is host math
      EXPECT_LT(rel_error(u_cuda.data(), u_cpu.data(), n), tolerance(p))
          << precision_name(p) << " convention " << static_cast<int>(conv);
    }
  }
}

TEST_F(CudaVsCpu, DefaultPrecisionIsBf16AndRunsAreDeterministic) {
  const int r = 64, c = 96;
  auto g = gaussian(size_t(r) * c, 23);
  std::vector<float> by_default(g.size()), bf16(g.size()), again(g.size());
  ASSERT_TRUE(cuda_->orthogonalize("w", {1, r, c}, g.data(), by_default.data(),
                                   unscaled(Precision::backend_default)));
  ASSERT_TRUE(
      cuda_->orthogonalize("w", {1, r, c}, g.data(), bf16.data(), unscaled(Precision::bf16)));
  ASSERT_TRUE(
      cuda_->orthogonalize("w", {1, r, c}, g.data(), again.data(), unscaled(Precision::bf16)));
  EXPECT_TRUE(bitwise_equal(by_default.data(), bf16.data(), g.size()));
  EXPECT_TRUE(bitwise_equal(bf16.data(), again.data(), g.size()));
}

TEST_F(CudaVsCpu, BuffersGrowAndAreReused) {
  // Small, large, small again: the second small run reuses the grown buffers and gives the same
  // bits as the first.
  auto small = gaussian(size_t(16) * 24, 29), large = gaussian(size_t(4) * 192 * 256, 31);
  std::vector<float> first(small.size()), second(small.size()), big(large.size());
  const auto o = unscaled(Precision::fp32);
  ASSERT_TRUE(cuda_->orthogonalize("s", {1, 16, 24}, small.data(), first.data(), o));
  ASSERT_TRUE(cuda_->orthogonalize("l", {4, 192, 256}, large.data(), big.data(), o));
  ASSERT_TRUE(cuda_->orthogonalize("s", {1, 16, 24}, small.data(), second.data(), o));
  EXPECT_TRUE(bitwise_equal(first.data(), second.data(), small.size()));
}

TEST_F(CudaVsCpu, NonFiniteInputFollowsThePolicy) {
  const int r = 8, c = 16;
  auto g = gaussian(size_t(r) * c, 37);
  g[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(g.size(), 3.0f);
  auto o = unscaled(Precision::bf16);
  EXPECT_THROW(cuda_->orthogonalize("w", {1, r, c}, g.data(), out.data(), o), NonFiniteError);
  o.nonfinite = NonFinitePolicy::skip;
  EXPECT_FALSE(cuda_->orthogonalize("w", {1, r, c}, g.data(), out.data(), o));
  for (float v : out) ASSERT_EQ(v, 0.0f);
}
