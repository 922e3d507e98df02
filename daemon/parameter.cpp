#include "daemon/parameter.hpp"

#include <algorithm>

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
  if (world_size > 0 && rank >= world_size + transport::kMaxRelayServers) {
    return "the replica session of server " +
           std::to_string(rank - world_size - transport::kMaxRelayServers);
  }
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

std::string ranks_text(const std::vector<int>& ranks, int world_size) {
  std::string s = "[";
  s += rank_ids_text(ranks, world_size);
  s += ']';
  return s;
}

std::vector<int64_t> dims_of(const MatrixShape& s) {
  if (s.batch == 1) return {s.rows, s.cols};
  return {s.batch, s.rows, s.cols};
}

bool contributes(const ParameterLayout& l, int rank) {
  return rank >= 0 && rank < static_cast<int>(l.ranks.size()) && !l.ranks[rank].push.empty();
}

std::vector<Range> covered(const ParameterLayout& l, std::vector<Range> RankRanges::*field) {
  std::vector<Range> all;
  for (const auto& r : l.ranks) all.insert(all.end(), (r.*field).begin(), (r.*field).end());
  std::vector<Range> out;
  for (const auto& r : sorted(std::move(all))) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<Range> sorted(std::vector<Range> r) {
  std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return r;
}

bool same_ranges(const std::vector<Range>& a, const std::vector<Range>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].begin != b[i].begin || a[i].end != b[i].end) return false;
  }
  return true;
}

}  // namespace muon::daemon
