#include "kernels/scale_rule.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace muon {

ScaleRule parse_scale_rule(std::string_view name) {
  if (name == "keller") return ScaleRule::keller;
  if (name == "match_adamw") return ScaleRule::match_adamw;
  if (name == "sqrt_max") return ScaleRule::sqrt_max;
  if (name == "unit_rms") return ScaleRule::unit_rms;
  if (name == "none") return ScaleRule::none;
  throw InvalidArgument(
      "unknown scale rule '" + std::string(name) +
      "' (known: keller, match_adamw, sqrt_max, unit_rms, none; the anchors' aliases are "
      "ambiguous and not accepted: original/shape_scaling -> keller, match_rms_adamw -> "
      "match_adamw, NVIDIA spectral -> sqrt_max, dion spectral_norm/unit_rms_norm -> unit_rms)");
}

std::string_view scale_rule_name(ScaleRule rule) {
  switch (rule) {
    case ScaleRule::keller:
      return "keller";
    case ScaleRule::match_adamw:
      return "match_adamw";
    case ScaleRule::sqrt_max:
      return "sqrt_max";
    case ScaleRule::unit_rms:
      return "unit_rms";
    case ScaleRule::none:
      return "none";
  }
  return "?";
}

double scale_factor(ScaleRule rule, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) {
    throw InvalidArgument("scale_factor: shape must be positive, got " + std::to_string(rows) +
                          "x" + std::to_string(cols));
  }
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  switch (rule) {
    case ScaleRule::keller:
      return std::sqrt(std::max(1.0, r / c));
    case ScaleRule::match_adamw:
      return 0.2 * std::sqrt(std::max(r, c));
    case ScaleRule::sqrt_max:
      return std::sqrt(std::max(r, c));
    case ScaleRule::unit_rms:
      return std::sqrt(r / c);
    case ScaleRule::none:
      return 1.0;
  }
  return 1.0;
}

}  // namespace muon
