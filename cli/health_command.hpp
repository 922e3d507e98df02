// `muon-offload health --socket PATH | --job NAME [--timeout-ms T]`: waits until a server (or
// every server of a launcher's job manifest) can take registrations; exit 0 when healthy, 1
// otherwise, naming the servers that are hung or gone. For launch scripts and operators.
#pragma once

#include <CLI/CLI.hpp>

namespace muon::cli {

void add_health_command(CLI::App& app);

}  // namespace muon::cli
