// Small formatters shared by the status views (cli/status_command.cpp, cli/job_status.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace muon::cli {

/// 3723.4 s -> "1h 02m 03s"; 12.5 -> "12.5 s"; negative or NaN -> "?".
std::string duration_text(double seconds);

/// A wait in seconds in the unit that reads best: "850 us", "12.5 ms", "1.25 s".
std::string wait_text(double seconds);

/// j[key] as T, or `def` when absent or null.
template <class T>
T get_or(const nlohmann::json& j, const char* key, T def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  return it->get<T>();
}

}  // namespace muon::cli
