// Collects the registrations of one parameter from the ranks of a job until all have registered,
// then derives and checks the contributor count (architecture guide, "Semantics").
#pragma once

#include <optional>
#include <vector>

#include "daemon/parameter.hpp"

namespace muon::daemon {

/// Registration state of one parameter across the ranks expected to register it here: every
/// rank 0..world_size-1, or the registrants a plan routes to this server (daemon/pool_routes.hpp:
/// a domain's ranks at its relay; at the owner, the ranks that push to it directly and the
/// relays' ranks, transport::relay_rank).
class PendingRegistration {
 public:
  /// Throws InvalidArgument (naming the parameter) when the spec itself is invalid: shape,
  /// options (muon::validate) or world_size < 1.
  PendingRegistration(ParameterSpec spec, int world_size);
  /// The same with explicit registrants (rank ids >= 0, any order, duplicates ignored; at least
  /// one). Throws InvalidArgument as above, or for an empty list or a negative id. `world_size`
  /// (0: unknown) only names relay ranks in messages ("relay server 1", rank_text).
  PendingRegistration(ParameterSpec spec, std::vector<int> registrants, int world_size = 0);

  /// Adds (or, for a rank that registered before, replaces) one rank's ranges. Ranges are sorted
  /// here; they must lie in [0, numel) and must not overlap within the rank (push and want
  /// checked separately). The spec must equal the first registrant's (same_spec). Throws
  /// InvalidArgument naming the parameter, the rank and the offending range or field (or a rank
  /// that is not a registrant); on a throw nothing changes. Returns true once every registrant
  /// has registered. `packed`: RankRanges::packed.
  bool add(int rank, const ParameterSpec& spec, std::vector<Range> push, std::vector<Range> want,
           bool packed = false);

  /// The registrants, ascending.
  const std::vector<int>& registrants() const { return registrants_; }
  /// Ranks that have not registered yet, ascending.
  std::vector<int> missing_ranks() const;

  /// Once complete: the layout with the derived contributor count. Throws InvalidArgument naming
  /// the parameter when some element has no contributor or the count is not the same for every
  /// element ("elements [a, b) have 1 contributor, elements [c, d) have 2").
  /// `partial`: the registrants are one domain of the job at its relay, which may push only part
  /// of the parameter (shards of the other domains' ranks), or none of it (contributors 0: the
  /// domain only wants the update): elements without a contributor are allowed; the count must
  /// still be the same for every element that has contributors.
  ParameterLayout finish(bool partial = false) const;

  const ParameterSpec& spec() const { return spec_; }

 private:
  /// Position of `rank` in registrants_, or -1.
  int slot_of(int rank) const;
  ParameterSpec spec_;
  std::vector<int> registrants_;                  // ascending, unique
  int world_size_ = 0;                            // for messages only
  std::vector<std::optional<RankRanges>> ranks_;  // by position in registrants_
};

}  // namespace muon::daemon
