#include "daemon/parameter.hpp"

#include "daemon/scheduler.hpp"

namespace muon::daemon {

bool same_spec(const ParameterSpec& a, const ParameterSpec& b) {
  return a.name == b.name && a.shape.batch == b.shape.batch && a.shape.rows == b.shape.rows &&
         a.shape.cols == b.shape.cols && a.grad_dtype == b.grad_dtype &&
         a.update_dtype == b.update_dtype && same_options(a.options, b.options);
}

int64_t total_elements(const std::vector<Range>& ranges) {
  int64_t n = 0;
  for (const auto& r : ranges) n += r.size();
  return n;
}

std::string rank_text(int rank, int world_size) {
  if (world_size > 0 && rank >= world_size) {
    return "relay server " + std::to_string(rank - world_size);
  }
  return "rank " + std::to_string(rank);
}

std::string rank_ids_text(const std::vector<int>& ranks, int world_size) {
  std::string s;
  for (int r : ranks) {
    const bool relay = world_size > 0 && r >= world_size;
    s += (s.empty() ? "" : ", ") + (relay ? rank_text(r, world_size) : std::to_string(r));
  }
  return s;
}

}  // namespace muon::daemon
