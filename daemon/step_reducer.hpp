// The reduction of one parameter's gradient for one step: each contributing rank's pushes are
// accumulated into that rank's own fp32 buffer (several pushes of the same element within a step
// add up: gradient accumulation), and the reduced gradient is the sum over ranks in ascending
// rank order, never in arrival order. The result is therefore bitwise the same however the
// gradient was cut into chunks and in whatever order chunks and ranks arrived.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/contribution_store.hpp"
#include "daemon/parameter.hpp"

namespace muon::daemon {

class StepReducer {
 public:
  /// `layout` must outlive the reducer. `store` holds the ranks' buffers: host memory by default,
  /// device memory for a server on the GPU data plane (then add() takes device contributions and
  /// reduce() writes a device pointer).
  StepReducer(const ParameterLayout& layout, int64_t step,
              std::unique_ptr<ContributionStore> store = make_host_contribution_store());

  int64_t step() const { return step_; }

  /// Starts gathering `step` afresh, keeping the buffers (already faulted-in pages are ~20x
  /// faster to write than fresh ones): the server keeps one reducer per parameter.
  void restart(int64_t step);

  /// Adds `values` (fp32) to rank `rank`'s contribution at elements [offset, offset + size).
  /// Throws InvalidArgument naming the parameter, step and rank when the rank pushes nothing,
  /// has already committed this step, or the range is not inside one of its push ranges.
  void add(int rank, int64_t offset, const Contribution& values);
  /// add() of host fp32 values.
  void add(int rank, int64_t offset, std::span<const float> values) {
    add(rank, offset,
        Contribution{values.data(), TileDType::f32, false, static_cast<int64_t>(values.size())});
  }
  /// add() at packed position `packed` of the rank's push ranges (a packed registration,
  /// transport::RegisterParam::packed): the values may span several ranges (a column block's
  /// rows), each piece added as add() adds it, so the sums are bitwise those of per-range pushes.
  /// Throws InvalidArgument as add(), naming the packed span when it is not inside the rank's
  /// pushed elements.
  void add_packed(int rank, int64_t packed, const Contribution& values);
  void add_packed(int rank, int64_t packed, std::span<const float> values) {
    add_packed(rank, packed,
               Contribution{values.data(), TileDType::f32, false,
                            static_cast<int64_t>(values.size())});
  }

  /// Declares which try of this step the rank's next push or commit belongs to
  /// (transport::Push::attempt). A higher attempt than the rank's current one discards what the
  /// rank pushed (and committed) for this step so far: the retry starts from nothing. Throws
  /// InvalidArgument for a lower one (a chunk of an abandoned try arriving late).
  void begin_attempt(int rank, uint32_t attempt);

  /// Marks rank's contribution complete. Throws InvalidArgument when some element of the rank's
  /// push ranges was never pushed this step (naming the first missing range), or the rank
  /// contributes nothing, or it already committed.
  void commit(int rank);

  /// True once every rank with a non-empty push set has committed.
  bool complete() const;

  /// Contributing ranks that have not committed yet, ascending.
  std::vector<int> missing_ranks() const;

  /// The reduced gradient, numel fp32 values (in the store's memory): for every element the sum of
  /// its contributors' values in ascending rank order. Requires complete(); throws Error
  /// otherwise.
  void reduce(float* grad);

 private:
  const ParameterLayout& layout_;
  int64_t step_;
  struct RankState {
    bool sized = false;         // the store holds the rank's packed buffer (range order)
    std::vector<Range> pushed;  // coverage this step: sorted, disjoint, merged element ranges
    bool committed = false;
    uint32_t attempt = 0;               // the rank's current try of this step
    std::vector<int64_t> packed_begin;  // index in `values` of each push range's first element
    int64_t packed_size = 0;            // total elements of the rank's push ranges
  };
  std::string who(int rank) const;  // "parameter 'w' step 3 rank 1"
  /// The rank's state after the checks add() and add_packed() share.
  RankState& writable(int rank);
  /// values[first, first + n) added at elements [offset, offset + n) of push range `index`.
  void write_piece(int rank, size_t index, int64_t offset, const Contribution& values,
                   int64_t first, int64_t n);
  std::vector<RankState> ranks_;
  std::unique_ptr<ContributionStore> store_;
};

}  // namespace muon::daemon
