#include "plan/ns_cost.hpp"

#include <algorithm>

namespace muon::plan {

double ns_step_flops(int64_t rows, int64_t cols, NsAlgorithm algorithm) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  switch (algorithm) {
    case NsAlgorithm::plain:
      return 4 * m * m * n + 2 * m * m * m;
    case NsAlgorithm::syrk:
    case NsAlgorithm::automatic:
      return 3 * m * m * n + m * m * m;
    case NsAlgorithm::gram:
      return 8 * m * m * m;
  }
  return 0;
}

double ns_run_flops(const MuonMatrix& matrix, int steps, NsAlgorithm algorithm) {
  const int64_t rows = matrix.rows / matrix.row_blocks;
  const double m = static_cast<double>(std::min(rows, matrix.cols));
  const double n = static_cast<double>(std::max(rows, matrix.cols));
  double per_matrix = steps * ns_step_flops(rows, matrix.cols, algorithm);
  if (algorithm == NsAlgorithm::gram) {
    const int runs = (steps + kDefaultGramRestart - 1) / kDefaultGramRestart;
    per_matrix += runs * 4 * m * m * n;
  }
  return per_matrix * static_cast<double>(matrix.batch * matrix.row_blocks);
}

}  // namespace muon::plan
