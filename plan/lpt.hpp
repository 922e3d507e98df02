// Longest processing time first (LPT): how the planner gives each parameter one owner server.
// Jobs (parameters, with their predicted Newton-Schulz seconds) are taken longest first and each
// goes to the server with the least load so far (ties: the lower server id; equal jobs: the lower
// job index), so the result is deterministic.
//
// Bounds, with m servers, total load W, largest job p_max and OPT the best possible makespan:
//   - Graham (1969): LPT's makespan <= (4/3 - 1/(3m)) OPT;
//   - any greedy list schedule: makespan <= W/m + p_max (the job that finishes last started on
//     the least-loaded server, whose load was at most (W - p)/m);
//   - and OPT >= max(W/m, p_max), so makespan / max(W/m, p_max) is the most this plan can lose.
#pragma once

#include <vector>

namespace muon::plan {

struct LptResult {
  std::vector<int> owner;    ///< per job: the server it goes to
  std::vector<double> load;  ///< per server: the sum of its jobs' costs
  double makespan = 0;       ///< max load
  double total = 0;          ///< sum of all costs
  double max_job = 0;

  /// max(total / servers, max_job): no assignment can do better.
  double lower_bound() const;
  /// total / servers + max_job: what any greedy list schedule stays within.
  double list_bound() const;
};

/// Assigns `costs` (seconds, >= 0) to `servers` (>= 1) servers by LPT. Throws InvalidArgument
/// for servers < 1 or a negative or non-finite cost.
LptResult lpt_assign(const std::vector<double>& costs, int servers);

/// Graham's LPT factor 4/3 - 1/(3m).
double lpt_graham_factor(int servers);

}  // namespace muon::plan
