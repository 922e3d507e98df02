#include <gtest/gtest.h>

#include <limits>

#include "kernels/elementwise.hpp"

using namespace muon;

TEST(Momentum, SumConventionByHand) {
  // M = mu*M + G;  Nesterov input G + mu*M_new.
  const float mu = 0.5f, m = 2.0f, g = 1.0f;
  const float m_new = momentum_step(MomentumConvention::sum, m, g, mu);
  EXPECT_EQ(m_new, 2.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::sum, true, m_new, g, mu), 2.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::sum, false, m_new, g, mu), 2.0f);
  const float m2 = momentum_step(MomentumConvention::sum, m_new, 3.0f, mu);  // 0.5*2+3
  EXPECT_EQ(m2, 4.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::sum, true, m2, 3.0f, mu), 5.0f);  // 3+0.5*4
}

TEST(Momentum, EmaConventionByHand) {
  // M = lerp(M, G, 1-mu) = mu*M + (1-mu)*G;  Nesterov input lerp(G, M, mu).
  const float mu = 0.75f;
  const float m_new = momentum_step(MomentumConvention::ema, 4.0f, 8.0f, mu);  // 4 + .25*4
  EXPECT_EQ(m_new, 5.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::ema, true, m_new, 8.0f, mu), 5.75f);  // 8-3*.25
  EXPECT_EQ(orthogonalize_input(MomentumConvention::ema, false, m_new, 8.0f, mu), 5.0f);
}

TEST(Momentum, LerpMatchesTorchsTwoBranchFormula) {
  // weight < 0.5: start + w*(end-start); else end - (end-start)*(1-w).
  EXPECT_EQ(lerp(1.0f, 3.0f, 0.25f), 1.0f + 0.25f * 2.0f);
  EXPECT_EQ(lerp(0.1f, 0.7f, 0.95f), 0.7f - (0.7f - 0.1f) * (1.0f - 0.95f));
  EXPECT_EQ(lerp(0.1f, 0.7f, 0.05f), 0.1f + 0.05f * (0.7f - 0.1f));
}

TEST(Momentum, ClientHeldMomentumPassesTheInputThrough) {
  EXPECT_EQ(momentum_step(MomentumConvention::none, 9.0f, 1.5f, 0.9f), 1.5f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::none, true, 9.0f, 1.5f, 0.9f), 1.5f);
}

TEST(Momentum, FiniteBitTest) {
  EXPECT_TRUE(is_finite_bits(1.0f));
  EXPECT_TRUE(is_finite_bits(-0.0f));
  EXPECT_FALSE(is_finite_bits(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(is_finite_bits(-std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(is_finite_bits(std::numeric_limits<float>::quiet_NaN()));
}
