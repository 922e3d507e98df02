// What Newton-Schulz costs on one parameter: FLOPs per step and in total, for each way the
// products can be formed (kernels/muon_options.hpp, NsAlgorithm).
#pragma once

#include <cstdint>

#include "kernels/muon_options.hpp"
#include "plan/model_config.hpp"

namespace muon::plan {

/// FLOPs of one Newton-Schulz step on one matrix, with m = min(rows, cols), n = max(rows, cols)
/// (the iteration runs on the wide orientation; architecture guide section 1):
///   plain  A = X X^T (2 m^2 n) + A A (2 m^3) + B X (2 m^2 n)           = 4 m^2 n + 2 m^3
///   syrk   X X^T and A A^T as SYRK, one triangle each (m^2 n + m^3) + B X (2 m^2 n)
///                                                                      = 3 m^2 n + m^3
///   gram   per step in Gram space: R^2, p(R) Q, p(R) R p(R) on m x m    = 8 m^3
///          (plus 4 m^2 n once per run of kDefaultGramRestart steps: R = X X^T and X = Q X0;
///          see ns_run_flops)
///   auto   counted as syrk (what it picks is measured on the server's machine)
/// The normalization (2 m n) and the elementwise terms are left out (< 0.1 %).
double ns_step_flops(int64_t rows, int64_t cols, NsAlgorithm algorithm);

/// FLOPs of a whole run of `steps` steps on one parameter: each of its batch x row_blocks
/// matrices of (rows / row_blocks) x cols is orthogonalized on its own.
double ns_run_flops(const MuonMatrix& matrix, int steps, NsAlgorithm algorithm);

}  // namespace muon::plan
