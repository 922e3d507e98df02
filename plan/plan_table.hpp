// The readable summary of a plan that `muon-offload plan` prints: domains with their serving and
// computing GPUs, servers with their load, the paths, the step cost and the candidates.
#pragma once

#include <ostream>

#include "plan/plan.hpp"

namespace muon::plan {

/// Prints the summary; server rows are cut to the first and last few when there are many.
void print_plan_table(const Plan& plan, std::ostream& out);

}  // namespace muon::plan
