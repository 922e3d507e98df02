#include "cli/status_text.hpp"

#include <cstdio>

namespace muon::cli {

std::string duration_text(double s) {
  if (!(s >= 0.0)) return "?";
  char buf[64];
  if (s < 60.0) {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  } else {
    const auto t = static_cast<long long>(s);
    if (t < 3600) {
      std::snprintf(buf, sizeof buf, "%lldm %02llds", t / 60, t % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%lldh %02lldm %02llds", t / 3600, (t / 60) % 60, t % 60);
    }
  }
  return buf;
}

std::string wait_text(double s) {
  char buf[64];
  if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  } else if (s < 1.0) {
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  }
  return buf;
}

}  // namespace muon::cli
