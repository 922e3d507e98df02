// Checks of numeric command-line values. CLI11's PositiveNumber and Range let NaN through (every
// comparison with NaN is false) and word a failure with the range's bounds in full (DBL_MAX as
// 309 digits); these refuse NaN and infinities too and say what is allowed in a few words.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <sstream>
#include <string>

namespace muon::cli {

namespace detail {

/// `text` as a double; false when it is not one (trailing characters included).
inline bool parse_number(const std::string& text, double& out) {
  std::istringstream in(text);
  in >> out;
  return !in.fail() && (in >> std::ws).eof();
}

inline std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace detail

/// A finite number > 0 (an integer option still converts it afterwards).
inline CLI::Validator finite_positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!detail::parse_number(text, v) || !std::isfinite(v) || v <= 0) {
          return "must be a finite number > 0, got '" + text + "'";
        }
        return {};
      },
      "NUMBER > 0");
}

/// A finite number in [lo, hi].
inline CLI::Validator finite_range(double lo, double hi) {
  const std::string range = "[" + detail::number_text(lo) + ", " + detail::number_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double v = 0;
        if (!detail::parse_number(text, v) || !std::isfinite(v) || v < lo || v > hi) {
          return "must be a finite number in " + range + ", got '" + text + "'";
        }
        return {};
      },
      "NUMBER in " + range);
}

}  // namespace muon::cli
