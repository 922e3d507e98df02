// A subcommand failure with its own exit status (cli/main.cpp prints "muon-offload: error:
// <message>" and exits with `exit_code`).
#pragma once

#include <string>

#include "core/error.hpp"

namespace muon::cli {

class CommandFailed : public Error {
 public:
  CommandFailed(int exit_code, const std::string& message,
                std::source_location where = std::source_location::current())
      : Error(message, where), exit_code(exit_code) {}
  int exit_code;
};

}  // namespace muon::cli
