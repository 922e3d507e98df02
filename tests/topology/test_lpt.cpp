// LPT ownership and its bounds. Stated bound, tested: makespan <= (4/3 - 1/(3m)) x OPT (Graham
// 1969) against brute-force OPT on random small instances, and makespan <= W/m + p_max (any
// greedy list schedule) on real models.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.hpp"
#include "plan/cost_model.hpp"
#include "plan/lpt.hpp"
#include "plan/model_config.hpp"

using namespace muon;
using namespace muon::plan;

namespace {

// Best makespan over all m^n assignments (n <= 9, m <= 3).
double brute_force_opt(const std::vector<double>& jobs, int m) {
  const size_t n = jobs.size();
  size_t total = 1;
  for (size_t i = 0; i < n; ++i) total *= static_cast<size_t>(m);
  double best = 1e300;
  std::vector<double> load(m);
  for (size_t code = 0; code < total; ++code) {
    std::fill(load.begin(), load.end(), 0.0);
    size_t c = code;
    for (size_t i = 0; i < n; ++i, c /= m) load[c % m] += jobs[i];
    best = std::min(best, *std::max_element(load.begin(), load.end()));
  }
  return best;
}

}  // namespace

TEST(Lpt, GrahamBoundAgainstBruteForceOptimum) {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> cost(0.1, 10.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int m = 2 + trial % 2;
    const int n = 4 + trial % 6;
    std::vector<double> jobs(n);
    for (auto& j : jobs) j = cost(rng);
    const LptResult r = lpt_assign(jobs, m);
    const double opt = brute_force_opt(jobs, m);
    EXPECT_LE(r.makespan, lpt_graham_factor(m) * opt + 1e-9) << "trial " << trial;
    EXPECT_LE(r.makespan, r.list_bound() + 1e-9);
    EXPECT_GE(r.makespan, r.lower_bound() - 1e-9);
    EXPECT_LE(r.lower_bound(), opt + 1e-9);
  }
}

TEST(Lpt, TightInstanceReachesGrahamsFactor) {
  // Two servers, jobs 3 3 2 2 2: LPT gives {3,2,2} {3,2} = 7, OPT {3,3} {2,2,2} = 6: 7/6 = 4/3 -
  // 1/6.
  const LptResult r = lpt_assign({3, 3, 2, 2, 2}, 2);
  EXPECT_DOUBLE_EQ(r.makespan, 7.0);
  EXPECT_DOUBLE_EQ(brute_force_opt({3, 3, 2, 2, 2}, 2), 6.0);
  EXPECT_DOUBLE_EQ(r.makespan / 6.0, lpt_graham_factor(2));
}

TEST(Lpt, DeterministicLongestFirstLeastLoaded) {
  const LptResult r = lpt_assign({1, 5, 5, 2, 1}, 2);
  // Order 5(job 1) 5(2) 2(3) 1(0) 1(4): 1->s0, 2->s1, 3->s0 (tie: lower id), 0->s1, 4->s1.
  EXPECT_EQ(r.owner, (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(r.load, (std::vector<double>{7, 7}));
  EXPECT_DOUBLE_EQ(r.total, 14);
  EXPECT_DOUBLE_EQ(r.max_job, 5);
  EXPECT_EQ(lpt_assign({}, 3).makespan, 0.0);
  EXPECT_THROW(lpt_assign({1.0}, 0), InvalidArgument);
  EXPECT_THROW(lpt_assign({-1.0}, 2), InvalidArgument);
}

TEST(Lpt, RealModelsStayWithinTheListBound) {
  CostSettings s;
  for (const char* file :
       {"llama3_8b.json", "llama3_70b.json", "qwen3_30b_a3b.json", "gpt2_124m.json"}) {
    const ModelConfig model = load_model_config(std::string(MUON_MODEL_CONFIGS) + "/" + file);
    std::vector<double> costs;
    for (const auto& m : model.muon) costs.push_back(parameter_seconds(m, s));
    for (int servers : {1, 2, 7, 8, 16, 72}) {
      SCOPED_TRACE(std::string(file) + " on " + std::to_string(servers) + " servers");
      const LptResult r = lpt_assign(costs, servers);
      EXPECT_LE(r.makespan, r.list_bound() * (1 + 1e-12));
      EXPECT_GE(r.makespan, r.lower_bound() * (1 - 1e-12));
      // Every parameter exactly once.
      double sum = 0;
      for (double l : r.load) sum += l;
      EXPECT_NEAR(sum, r.total, 1e-9 * r.total);
    }
  }
}
