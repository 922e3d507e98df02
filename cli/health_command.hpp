// `muon-offload health --socket PATH [--timeout-ms T]`: waits until a server can take
// registrations; exit 0 when healthy, 1 otherwise. For launch scripts.
#pragma once

#include <CLI/CLI.hpp>

namespace muon::cli {

void add_health_command(CLI::App& app);

}  // namespace muon::cli
