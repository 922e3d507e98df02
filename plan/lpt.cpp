#include "plan/lpt.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.hpp"

namespace muon::plan {

double LptResult::lower_bound() const {
  return load.empty() ? 0 : std::max(total / static_cast<double>(load.size()), max_job);
}

double LptResult::list_bound() const {
  return load.empty() ? 0 : total / static_cast<double>(load.size()) + max_job;
}

double lpt_graham_factor(int servers) {
  return 4.0 / 3.0 - 1.0 / (3.0 * servers);
}

LptResult lpt_assign(const std::vector<double>& costs, int servers) {
  if (servers < 1) throw InvalidArgument("LPT needs at least one server");
  for (size_t i = 0; i < costs.size(); ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      throw InvalidArgument("LPT: cost of job " + std::to_string(i) +
                            " is not a finite number >= 0");
    }
  }
  std::vector<int> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return costs[a] > costs[b]; });
  LptResult r;
  r.owner.assign(costs.size(), -1);
  r.load.assign(static_cast<size_t>(servers), 0.0);
  for (int job : order) {
    const auto least = std::min_element(r.load.begin(), r.load.end());  // first minimum
    *least += costs[job];
    r.owner[job] = static_cast<int>(least - r.load.begin());
    r.total += costs[job];
    r.max_job = std::max(r.max_job, costs[job]);
  }
  r.makespan = *std::max_element(r.load.begin(), r.load.end());
  return r;
}

}  // namespace muon::plan
