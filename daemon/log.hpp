// The server's logger: "server" (made by main.cpp with its level and sinks), or spdlog's default
// logger in processes that make none (tests).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace muon::daemon {

inline const std::shared_ptr<spdlog::logger>& log() {
  static const auto logger = [] {
    auto l = spdlog::get("server");
    return l ? l : spdlog::default_logger();
  }();
  return logger;
}

}  // namespace muon::daemon
