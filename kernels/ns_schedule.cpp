#include "kernels/ns_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace muon {
namespace {

constexpr NsCoefficients kKellerQuintic{3.4445, -4.7750, 2.0315};

// Amsel, Persson, Musco, Gower (2025), "The Polar Express", Algorithm 1, degree 5.
const std::vector<NsCoefficients> kPolarExpressRaw = {
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
    {1.875, -1.25, 0.375},
};

// p(s) -> p(s / f) * ... : dividing a, b, c by f, f^3, f^5 evaluates the polynomial at s / f.
std::vector<NsCoefficients> with_safety(const std::vector<NsCoefficients>& raw, double f,
                                        size_t count, bool keep_last) {
  std::vector<NsCoefficients> out;
  for (size_t i = 0; i < count; ++i) {
    const auto& k = raw[i];
    if (keep_last && i + 1 == count) {
      out.push_back(k);
    } else {
      out.push_back({k.a / f, k.b / (f * f * f), k.c / (f * f * f * f * f)});
    }
  }
  return out;
}

std::vector<NsSchedule> build_schedules() {
  std::vector<NsSchedule> s;
  s.push_back({"keller",
               {"simple", "keller_quintic"},
               {kKellerQuintic},
               ExtraStepRule::cycle,
               5,
               1,
               "Keller Jordan, Muon (2024), modded-nanogpt zeropower_via_newtonschulz5"});
  s.push_back({"you",
               {"quintic", "you_quintic"},
               {{4.0848, -6.8946, 2.9270},
                {3.9505, -6.3029, 2.6377},
                {3.7418, -5.5913, 2.3037},
                {2.8769, -3.1427, 1.2046},
                {2.8366, -3.0525, 1.2012}},
               ExtraStepRule::cycle,
               5,
               1,
               "Jiacheng You's coefficients, modded-nanogpt train_gpt_medium.py; NVIDIA "
               "Emerging-Optimizers 'quintic'"});
  s.push_back({"polar_express",
               {"polar_express_1.01"},
               with_safety(kPolarExpressRaw, 1.01, kPolarExpressRaw.size(), true),
               ExtraStepRule::repeat_last,
               5,
               1,
               "Amsel et al. 2025, arXiv:2505.16932, Algorithm 1 (safety factor 1.01)"});
  s.push_back({"polar_express_raw",
               {},
               kPolarExpressRaw,
               ExtraStepRule::repeat_last,
               5,
               1,
               "Amsel et al. 2025, arXiv:2505.16932 (unscaled)"});
  s.push_back({"polar_express_nvidia",
               {},
               {{8.2051, -22.9019, 16.4607},
                {4.0664, -2.8612, 0.5184},
                {3.9096, -2.8234, 0.5250},
                {3.2856, -2.4153, 0.4853},
                {2.2779, -1.6198, 0.3985},
                {1.8726, -1.2307, 0.3585},
                {1.8564, -1.2132, 0.3568},
                {1.8750, -1.2500, 0.3750}},
               ExtraStepRule::repeat_last,
               8,
               1,
               "NVIDIA Emerging-Optimizers / TransformerEngine 'polar_express' table"});
  s.push_back({"polar_express_105",
               {},
               with_safety(kPolarExpressRaw, 1.05, 5, false),
               ExtraStepRule::repeat_last,
               5,
               1,
               "Polar Express first 5 steps, safety 1.05 (Dao-AILab gram-newton-schulz)"});
  s.push_back(
      {"cans",
       {},
       {{8.4703, -25.1081, 18.6293},
        {4.1828, -3.1087, 0.5806},
        {3.9619, -2.9541, 0.5630},
        {3.2866, -2.4647, 0.5074},
        {2.2737, -1.6447, 0.4162}},
       ExtraStepRule::repeat_last,
       5,
       1,
       "CANS, Grishina et al. 2025, arXiv:2506.10935, as NVIDIA TransformerEngine ships it"});
  s.push_back({"aol",
               {},
               {{4.0098, -7.0585, 2.4635},
                {3.4585, -5.5479, 2.5959},
                {2.7573, -3.2939, 1.4254},
                {2.7215, -3.0494, 1.3169}},
               ExtraStepRule::cycle,
               4,
               1,
               "flash-newton-schulz AOL set (thib-s), as NVIDIA Emerging-Optimizers ships it"});
  s.push_back({"deepseek_v4",
               {"hybrid"},
               {{2.0, -1.5, 0.5}, {2.0, -1.5, 0.5}},
               ExtraStepRule::hybrid_tail,
               10,
               3,
               "DeepSeek-V4 hybrid: 8 quintic (3.4445, -4.7750, 2.0315) + 2 x (2.0, -1.5, 0.5)"});
  return s;
}

}  // namespace

std::vector<NsCoefficients> NsSchedule::coefficients(int steps) const {
  if (steps == 0) steps = default_steps;
  if (steps < min_steps || steps > 100) {
    throw InvalidArgument("Newton-Schulz schedule '" + name + "' takes " +
                          std::to_string(min_steps) + "..100 steps, got " + std::to_string(steps));
  }
  std::vector<NsCoefficients> out;
  out.reserve(steps);
  const int n = static_cast<int>(listed.size());
  for (int i = 0; i < steps; ++i) {
    switch (rule) {
      case ExtraStepRule::cycle:
        out.push_back(listed[i % n]);
        break;
      case ExtraStepRule::repeat_last:
        out.push_back(listed[std::min(i, n - 1)]);
        break;
      case ExtraStepRule::hybrid_tail:
        out.push_back(i < steps - n ? kKellerQuintic : listed[i - (steps - n)]);
        break;
    }
  }
  return out;
}

const std::vector<NsSchedule>& ns_schedules() {
  static const std::vector<NsSchedule> schedules = build_schedules();
  return schedules;
}

const NsSchedule& find_ns_schedule(std::string_view name) {
  std::string known;
  for (const auto& s : ns_schedules()) {
    if (s.name == name) return s;
    for (const auto& alias : s.aliases) {
      if (alias == name) return s;
    }
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw InvalidArgument("unknown Newton-Schulz schedule '" + std::string(name) +
                        "' (known: " + known + ")");
}

double ns_scalar_map(const std::vector<NsCoefficients>& coefficients, double s) {
  for (const auto& k : coefficients) {
    const double s2 = s * s;
    s = k.a * s + k.b * s2 * s + k.c * s2 * s2 * s;
  }
  return s;
}

std::pair<double, double> ns_promised_band(const std::vector<NsCoefficients>& coefficients,
                                           double s_min) {
  if (!(s_min > 0.0 && s_min <= 1.0)) {
    throw InvalidArgument("ns_promised_band: s_min must lie in (0, 1], got " +
                          std::to_string(s_min));
  }
  constexpr int kPoints = 4096;
  double lo = INFINITY, hi = -INFINITY;
  const double log_lo = std::log(s_min);
  for (int i = 0; i <= kPoints; ++i) {
    const double s = std::exp(log_lo * (1.0 - static_cast<double>(i) / kPoints));
    const double v = ns_scalar_map(coefficients, s);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

}  // namespace muon
