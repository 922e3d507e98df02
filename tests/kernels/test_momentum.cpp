#include <gtest/gtest.h>

#include <limits>

#include "kernels/elementwise.hpp"

using namespace muon;

TEST(Momentum, SumConventionByHand) {
  // M = mu*M + G;  Nesterov input G + mu*M_new.
  const auto k = momentum_coefficients(0.5);
  const float m = 2.0f, g = 1.0f;
  const float m_new = momentum_step(MomentumConvention::sum, m, g, k);
  EXPECT_EQ(m_new, 2.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::sum, true, m_new, g, k), 2.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::sum, false, m_new, g, k), 2.0f);
  const float m2 = momentum_step(MomentumConvention::sum, m_new, 3.0f, k);  // 0.5*2+3
  EXPECT_EQ(m2, 4.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::sum, true, m2, 3.0f, k), 5.0f);  // 3+0.5*4
}

TEST(Momentum, EmaConventionByHand) {
  // M = lerp(M, G, 1-mu) = mu*M + (1-mu)*G;  Nesterov input lerp(G, M, mu).
  const auto k = momentum_coefficients(0.75);
  const float m_new = momentum_step(MomentumConvention::ema, 4.0f, 8.0f, k);  // 4 + .25*4
  EXPECT_EQ(m_new, 5.0f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::ema, true, m_new, 8.0f, k), 5.75f);  // 8-3*.25
  EXPECT_EQ(orthogonalize_input(MomentumConvention::ema, false, m_new, 8.0f, k), 5.0f);
}

TEST(Momentum, EmaWeightIsOneMinusMuInDoubleRoundedOnce) {
  // torch.optim.Muon: buf.lerp_(grad, 1 - momentum), 1 - 0.95 in Python (double) =
  // 0.050000000000000044, rounded once to float: 0x1.99999ap-5. 1.0f - 0.95f is 0x1.9999a0p-5.
  const auto k = momentum_coefficients(0.95);
  EXPECT_EQ(k.ema_weight, 0x1.99999ap-5f);
  EXPECT_NE(k.ema_weight, 1.0f - 0.95f);
  EXPECT_EQ(k.mu, 0.95f);
}

TEST(Momentum, LerpIsTorchsFusedTwoBranchFormula) {
  // weight < 0.5: fma(w, end-start, start); else fma(w-1, end-start, end) (ATen's lerp_vec).
  // Each pair below was picked where the fused result differs from the unfused one; the
  // expected value is what torch 2.15's CPU lerp returned for these inputs.
  const float w_small = momentum_coefficients(0.95).ema_weight;
  EXPECT_EQ(lerp(0x1.b742d2p-4f, 0x1.399bc6p-1f, w_small), 0x1.0f5ee6p-3f);
  EXPECT_NE(0x1.b742d2p-4f + w_small * (0x1.399bc6p-1f - 0x1.b742d2p-4f), 0x1.0f5ee6p-3f);
  EXPECT_EQ(lerp(-0x1.b0a43ap-2f, -0x1.54bb3ep-4f, 0.95f), -0x1.9a3922p-4f);
  const float d = -0x1.54bb3ep-4f - -0x1.b0a43ap-2f;
  EXPECT_NE(-0x1.54bb3ep-4f - d * (1.0f - 0.95f), -0x1.9a3922p-4f);
  // The branches meet exactly at the ends.
  EXPECT_EQ(lerp(1.0f, 3.0f, 0.0f), 1.0f);
  EXPECT_EQ(lerp(1.0f, 3.0f, 1.0f), 3.0f);
  EXPECT_EQ(lerp(1.0f, 3.0f, 0.25f), 1.5f);
}

TEST(Momentum, ClientHeldMomentumPassesTheInputThrough) {
  const auto k = momentum_coefficients(0.9);
  EXPECT_EQ(momentum_step(MomentumConvention::none, 9.0f, 1.5f, k), 1.5f);
  EXPECT_EQ(orthogonalize_input(MomentumConvention::none, true, 9.0f, 1.5f, k), 1.5f);
}

TEST(Momentum, FiniteBitTest) {
  EXPECT_TRUE(is_finite_bits(1.0f));
  EXPECT_TRUE(is_finite_bits(-0.0f));
  EXPECT_FALSE(is_finite_bits(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(is_finite_bits(-std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(is_finite_bits(std::numeric_limits<float>::quiet_NaN()));
}
