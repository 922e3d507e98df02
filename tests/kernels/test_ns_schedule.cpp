#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/ns_schedule.hpp"

using namespace muon;

TEST(NsSchedule, KellerIsTheFixedQuinticCycled) {
  const auto& s = find_ns_schedule("keller");
  auto k = s.coefficients(0);
  ASSERT_EQ(k.size(), 5u);
  for (const auto& c : k) {
    EXPECT_EQ(c.a, 3.4445);
    EXPECT_EQ(c.b, -4.7750);
    EXPECT_EQ(c.c, 2.0315);
  }
  EXPECT_EQ(s.coefficients(7).size(), 7u);
  EXPECT_EQ(&find_ns_schedule("simple"), &s);  // NVIDIA's name
}

TEST(NsSchedule, YouSetCyclesAfterFiveSteps) {
  const auto& s = find_ns_schedule("quintic");  // NVIDIA's name for it
  EXPECT_EQ(s.name, "you");
  auto k = s.coefficients(7);
  EXPECT_EQ(k[0].a, 4.0848);
  EXPECT_EQ(k[4].c, 1.2012);
  EXPECT_EQ(k[5].a, k[0].a);  // step 6 restarts the cycle
  EXPECT_EQ(k[6].b, k[1].b);
}

TEST(NsSchedule, PolarExpressSafetyScaledFromThePaperRepeatsLast) {
  const auto& raw = find_ns_schedule("polar_express_raw").coefficients(8);
  const auto& pe = find_ns_schedule("polar_express").coefficients(10);
  EXPECT_EQ(raw[0].a, 8.28721201814563);
  EXPECT_DOUBLE_EQ(pe[0].a, 8.28721201814563 / 1.01);
  EXPECT_DOUBLE_EQ(pe[0].b, -23.595886519098837 / std::pow(1.01, 3));
  EXPECT_DOUBLE_EQ(pe[0].c, 17.300387312530933 / std::pow(1.01, 5));
  // The last listed step is kept unscaled, and extra steps repeat it.
  for (int i = 7; i < 10; ++i) {
    EXPECT_EQ(pe[i].a, 1.875);
    EXPECT_EQ(pe[i].b, -1.25);
    EXPECT_EQ(pe[i].c, 0.375);
  }
  // NVIDIA's table is the same schedule to 4 decimals (not always correctly rounded:
  // 8.28721.../1.01 = 8.20516 ships as 8.2051).
  const auto nv = find_ns_schedule("polar_express_nvidia").coefficients(8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(nv[i].a, pe[i].a, 1.1e-4) << i;
    EXPECT_NEAR(nv[i].b, pe[i].b, 1.1e-4) << i;
    EXPECT_NEAR(nv[i].c, pe[i].c, 1.1e-4) << i;
  }
  const auto s105 = find_ns_schedule("polar_express_105").coefficients(6);
  EXPECT_DOUBLE_EQ(s105[4].a, 2.300652019954817 / 1.05);
  EXPECT_EQ(s105[5].a, s105[4].a);
}

TEST(NsSchedule, CansRepeatsLastAolCycles) {
  auto cans = find_ns_schedule("cans").coefficients(7);
  EXPECT_EQ(cans[0].a, 8.4703);
  EXPECT_EQ(cans[6].a, 2.2737);
  auto aol = find_ns_schedule("aol").coefficients(5);
  EXPECT_EQ(aol[0].b, -7.0585);
  EXPECT_EQ(aol[4].b, -7.0585);
}

TEST(NsSchedule, DeepSeekV4HybridIsEightQuinticThenTwoConvergent) {
  auto k = find_ns_schedule("deepseek_v4").coefficients(0);
  ASSERT_EQ(k.size(), 10u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(k[i].a, 3.4445);
  for (int i = 8; i < 10; ++i) {
    EXPECT_EQ(k[i].a, 2.0);
    EXPECT_EQ(k[i].b, -1.5);
    EXPECT_EQ(k[i].c, 0.5);
  }
  auto six = find_ns_schedule("deepseek_v4").coefficients(6);
  EXPECT_EQ(six[3].a, 3.4445);
  EXPECT_EQ(six[4].a, 2.0);
  EXPECT_THROW(find_ns_schedule("deepseek_v4").coefficients(2), InvalidArgument);
}

TEST(NsSchedule, UnknownNameAndBadStepsAreClearErrors) {
  try {
    find_ns_schedule("polar");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("polar_express"), std::string::npos) << e.what();
  }
  EXPECT_THROW(find_ns_schedule("keller").coefficients(-1), InvalidArgument);
  EXPECT_THROW(find_ns_schedule("keller").coefficients(101), InvalidArgument);
}

TEST(NsSchedule, ScalarMapIsTheComposedQuintic) {
  std::vector<NsCoefficients> one{{3.4445, -4.7750, 2.0315}};
  const double s = 0.3;
  EXPECT_DOUBLE_EQ(ns_scalar_map(one, s),
                   3.4445 * s - 4.7750 * s * s * s + 2.0315 * std::pow(s, 5));
  EXPECT_EQ(ns_scalar_map(one, 0.0), 0.0);
}

TEST(NsSchedule, PromisedBands) {
  // Keller's quintic trades exactness for speed: 5 steps put directions above 1e-2 of the
  // Frobenius norm into [0.68, 1.13]; at 1e-3 the slope at zero (a^5 = 487) is not enough.
  auto [lo, hi] = ns_promised_band(find_ns_schedule("keller").coefficients(5), 1e-2);
  EXPECT_NEAR(lo, 0.6818, 1e-3);
  EXPECT_NEAR(hi, 1.1344, 1e-3);
  EXPECT_LT(ns_promised_band(find_ns_schedule("keller").coefficients(5), 1e-3).first, 0.5);
  // You's set is tighter: [0.978, 1.032].
  auto [ylo, yhi] = ns_promised_band(find_ns_schedule("you").coefficients(5), 1e-2);
  EXPECT_GT(ylo, 0.977);
  EXPECT_LT(yhi, 1.033);
  // The convergent tail of DeepSeek-V4 tightens the band around 1.
  auto [dlo, dhi] = ns_promised_band(find_ns_schedule("deepseek_v4").coefficients(10), 1e-3);
  EXPECT_GT(dlo, 0.9999);
  EXPECT_LT(dhi, 1.001);
  // Polar Express converges: with 8 steps directions above 1e-3 end within 0.1 % of 1.
  auto [plo, phi] = ns_promised_band(find_ns_schedule("polar_express").coefficients(8), 1e-3);
  EXPECT_GT(plo, 0.999);
  EXPECT_LT(phi, 1.001);
  // NVIDIA's AOL set under plain Frobenius normalization flips near-rank-1 directions.
  EXPECT_LT(ns_scalar_map(find_ns_schedule("aol").coefficients(1), 1.0), 0.0);
  EXPECT_GT(ns_scalar_map(find_ns_schedule("aol").coefficients(1), 0.88), 0.0);
  EXPECT_THROW(ns_promised_band({}, 0.0), InvalidArgument);
}
