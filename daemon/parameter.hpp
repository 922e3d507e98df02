// A registered parameter as the server sees it: its global spec and, per compute rank, the element
// ranges the rank contributes (push) and wants back (want).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/muon_options.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

using transport::DType;
using transport::Range;

/// What every rank must agree on when registering a parameter.
struct ParameterSpec {
  std::string name;
  MatrixShape shape;  ///< global shape: [batch, rows, cols]
  DType grad_dtype = DType::f32;
  DType update_dtype = DType::f32;
  MuonOptions options;
};

/// One rank's ranges for a parameter, sorted by begin, non-overlapping, within [0, numel).
struct RankRanges {
  int rank = 0;
  std::vector<Range> push;
  std::vector<Range> want;
  /// The rank's gradient chunks and updates are addressed by packed position in push / want
  /// (transport::RegisterParam::packed): one chunk may span several ranges.
  bool packed = false;
};

/// A parameter whose registration is complete (every expected registrant registered it).
struct ParameterLayout {
  ParameterSpec spec;
  /// Indexed by rank id, up to the largest registrant; ids that are not registrants (ranks a
  /// plan routes to another server) have empty ranges.
  std::vector<RankRanges> ranks;
  std::vector<int> registrants;  ///< the ranks that registered it here, ascending
  int contributors = 0;          ///< contributions summed into every element (uniform, >= 1)
};

/// True when two specs describe the same parameter (name, shape, dtypes and every option).
bool same_spec(const ParameterSpec& a, const ParameterSpec& b);

/// Sum of range sizes.
int64_t total_elements(const std::vector<Range>& ranges);

/// "rank 3", or for a relay's rank id (transport::relay_rank: >= world_size, when world_size > 0)
/// "relay server 1".
std::string rank_text(int rank, int world_size);
/// "0, 1, relay server 1": rank ids as in rank_text, without the word "rank".
std::string rank_ids_text(const std::vector<int>& ranks, int world_size);
/// "[0, 1, relay server 1]": rank_ids_text in brackets.
std::string ranks_text(const std::vector<int>& ranks, int world_size);

/// The shape as wire dims: [rows, cols], or [batch, rows, cols] when batch > 1.
std::vector<int64_t> dims_of(const MatrixShape& shape);

/// A rank contributes to a parameter when it pushes at least one element.
bool contributes(const ParameterLayout& layout, int rank);

/// The union of every rank's push (or want) ranges, merged, ascending.
std::vector<Range> covered(const ParameterLayout& layout, std::vector<Range> RankRanges::*field);

/// `ranges` sorted by begin.
std::vector<Range> sorted(std::vector<Range> ranges);

/// True when both lists hold the same ranges in the same order.
bool same_ranges(const std::vector<Range>& a, const std::vector<Range>& b);

}  // namespace muon::daemon
