#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/scale_rule.hpp"

using namespace muon;

struct ScaleCase {
  ScaleRule rule;
  int64_t r, c;
  double expected;
};

TEST(ScaleRule, EachRuleOnTallWideSquare) {
  const ScaleCase cases[] = {
      // keller: max(1, r/c)^0.5
      {ScaleRule::keller, 4096, 1024, 2.0},
      {ScaleRule::keller, 1024, 4096, 1.0},
      {ScaleRule::keller, 768, 768, 1.0},
      // match_adamw: 0.2 sqrt(max(r, c))
      {ScaleRule::match_adamw, 4096, 1024, 0.2 * 64.0},
      {ScaleRule::match_adamw, 1024, 4096, 0.2 * 64.0},
      {ScaleRule::match_adamw, 768, 768, 0.2 * std::sqrt(768.0)},
      // sqrt_max: sqrt(max(r, c))
      {ScaleRule::sqrt_max, 4096, 1024, 64.0},
      {ScaleRule::sqrt_max, 1024, 4096, 64.0},
      {ScaleRule::sqrt_max, 768, 768, std::sqrt(768.0)},
      // unit_rms: sqrt(r/c)
      {ScaleRule::unit_rms, 4096, 1024, 2.0},
      {ScaleRule::unit_rms, 1024, 4096, 0.5},
      {ScaleRule::unit_rms, 768, 768, 1.0},
      {ScaleRule::none, 4096, 1024, 1.0},
      {ScaleRule::none, 1024, 4096, 1.0},
  };
  for (const auto& k : cases) {
    EXPECT_DOUBLE_EQ(scale_factor(k.rule, k.r, k.c), k.expected)
        << scale_rule_name(k.rule) << " " << k.r << "x" << k.c;
  }
}

TEST(ScaleRule, NamesRoundTripAndAliasesAreRefused) {
  for (auto r : {ScaleRule::keller, ScaleRule::match_adamw, ScaleRule::sqrt_max,
                 ScaleRule::unit_rms, ScaleRule::none}) {
    EXPECT_EQ(parse_scale_rule(scale_rule_name(r)), r);
  }
  // "spectral" means sqrt(max) to NVIDIA and sqrt(r/c) to dion: ambiguous, so refused.
  try {
    parse_scale_rule("spectral");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sqrt_max"), std::string::npos);
  }
  EXPECT_THROW(scale_factor(ScaleRule::keller, 0, 3), InvalidArgument);
}
