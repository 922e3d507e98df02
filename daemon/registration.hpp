// Collects the registrations of one parameter from the ranks of a job until all have registered,
// then derives and checks the contributor count (architecture guide, "Semantics").
#pragma once

#include <optional>
#include <vector>

#include "daemon/parameter.hpp"

namespace muon::daemon {

/// Registration state of one parameter across `world_size` ranks.
class PendingRegistration {
 public:
  /// Throws InvalidArgument (naming the parameter) when the spec itself is invalid: shape,
  /// options (muon::validate) or world_size < 1.
  PendingRegistration(ParameterSpec spec, int world_size);

  /// Adds (or, for a rank that registered before, replaces) one rank's ranges. Ranges are sorted
  /// here; they must lie in [0, numel) and must not overlap within the rank (push and want
  /// checked separately). The spec must equal the first registrant's (same_spec). Throws
  /// InvalidArgument naming the parameter, the rank and the offending range or field; on a throw
  /// nothing changes. Returns true once every rank 0..world_size-1 has registered.
  bool add(int rank, const ParameterSpec& spec, std::vector<Range> push, std::vector<Range> want);

  /// Ranks that have not registered yet, ascending.
  std::vector<int> missing_ranks() const;

  /// Once complete: the layout with the derived contributor count. Throws InvalidArgument naming
  /// the parameter when some element has no contributor or the count is not the same for every
  /// element ("elements [a, b) have 1 contributor, elements [c, d) have 2").
  ParameterLayout finish() const;

  const ParameterSpec& spec() const { return spec_; }

 private:
  ParameterSpec spec_;
  int world_size_;
  std::vector<std::optional<RankRanges>> ranks_;
};

}  // namespace muon::daemon
