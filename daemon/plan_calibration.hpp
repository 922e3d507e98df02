// What the job's plan says this server's Newton-Schulz will run, so that auto's choices
// (kernels/ns_choice.hpp) are measured when the server starts instead of when the parameters
// register: the plan (`muon-offload plan`, plan/plan_json.cpp) gives every parameter's shape,
// row blocks and owner, and the job's schedule and step count.
#pragma once

#include <string>
#include <vector>

#include "kernels/muon_options.hpp"

namespace muon::daemon {

/// One parameter the plan has this server own, with the options its registration is expected
/// to carry: the defaults of MuonOptions (algorithm auto) with the plan's "settings.schedule"
/// and "settings.ns_steps" and, for "row_blocks" k > 1, k equal row splits.
struct PlannedMatrix {
  std::string name;
  MatrixShape shape;
  MuonOptions options;
};

/// The parameters of the plan's JSON text owned by `server_id` (parameters[].owner) that give a
/// "shape" ([rows, cols] or [batch, rows, cols]), in plan order; a parameter without one
/// (hand-written plans) is left out. Throws InvalidArgument (naming `source` and the field) for
/// text that is not JSON, or a shape, row_blocks or settings entry of the wrong type or extent.
std::vector<PlannedMatrix> planned_matrices(const std::string& plan_json, int server_id,
                                            const std::string& source);
/// The same from the plan file at `path`; InvalidArgument when it cannot be read.
std::vector<PlannedMatrix> planned_matrices_from_file(const std::string& path, int server_id);

}  // namespace muon::daemon
