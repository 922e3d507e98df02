// `muon-offload plan --topology auto|FILE --model CONFIG [...]`: plans the offload servers of a
// job (plan/plan.hpp), prints the summary table and, with --output, writes the plan JSON
// (muon-offload-plan/1) that scripts/muon-offload-launch reads.
#pragma once

#include <CLI/CLI.hpp>

namespace muon::cli {

void add_plan_command(CLI::App& app);

}  // namespace muon::cli
