#include "daemon/registration.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "kernels/range_set.hpp"

namespace muon::daemon {
namespace {

// Upper bound on a parameter's element count (as on the wire, transport/messages.cpp); also keeps
// batch * rows * cols far from int64 overflow.
constexpr int64_t kMaxElements = int64_t{1} << 40;

std::string contributors_str(int count) {
  return std::to_string(count) + (count == 1 ? " contributor" : " contributors");
}

// Sorts `ranges` by begin, drops empty ones and checks them against [0, numel) and each other.
// `what` is "push" or "want"; `who` prefixes the message.
void normalize_ranges(std::vector<Range>& ranges, int64_t numel, const std::string& who,
                      const char* what) {
  ranges = RangeSet::disjoint(std::move(ranges), numel, who + ": " + what).ranges();
}

std::vector<int> all_ranks(const std::string& name, int world_size) {
  if (world_size < 1) {
    throw InvalidArgument("parameter '" + name + "': world size must be >= 1, got " +
                          std::to_string(world_size));
  }
  std::vector<int> out(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) out[static_cast<size_t>(r)] = r;
  return out;
}

}  // namespace

PendingRegistration::PendingRegistration(ParameterSpec spec, int world_size)
    : PendingRegistration(spec, all_ranks(spec.name, world_size)) {}

PendingRegistration::PendingRegistration(ParameterSpec spec, std::vector<int> registrants,
                                         int world_size)
    : spec_(std::move(spec)), registrants_(std::move(registrants)), world_size_(world_size) {
  const std::string who = "parameter '" + spec_.name + "'";
  std::sort(registrants_.begin(), registrants_.end());
  registrants_.erase(std::unique(registrants_.begin(), registrants_.end()), registrants_.end());
  if (registrants_.empty() || registrants_.front() < 0) {
    throw InvalidArgument(who + ": registrants must be a non-empty list of rank ids >= 0");
  }
  const auto& s = spec_.shape;
  if (s.batch > 0 && s.rows > 0 && s.cols > 0 &&
      (s.rows > kMaxElements / s.cols || s.batch > kMaxElements / (s.rows * s.cols))) {
    throw InvalidArgument(who + ": shape " + s.str() + " has more than 2^40 elements");
  }
  validate(spec_.options, spec_.shape, spec_.name);  // names the matrix in its message
  ranks_.resize(registrants_.size());
}

int PendingRegistration::slot_of(int rank) const {
  const auto it = std::lower_bound(registrants_.begin(), registrants_.end(), rank);
  return it != registrants_.end() && *it == rank ? static_cast<int>(it - registrants_.begin()) : -1;
}

bool PendingRegistration::add(int rank, const ParameterSpec& spec, std::vector<Range> push,
                              std::vector<Range> want, bool packed) {
  const std::string who = "parameter '" + spec_.name + "' " + rank_text(rank, world_size_);
  const int slot = slot_of(rank);
  if (slot < 0) {
    throw InvalidArgument(who + ": not expected to register it on this server (registrants: " +
                          rank_ids_text(registrants_, world_size_) + ")");
  }
  if (!same_spec(spec, spec_)) {
    std::string field = "options";
    if (spec.name != spec_.name) {
      field = "name ('" + spec.name + "')";
    } else if (spec.shape.batch != spec_.shape.batch || spec.shape.rows != spec_.shape.rows ||
               spec.shape.cols != spec_.shape.cols) {
      field = "shape (" + spec.shape.str() + " vs " + spec_.shape.str() + ")";
    } else if (spec.grad_dtype != spec_.grad_dtype) {
      field = "grad_dtype";
    } else if (spec.update_dtype != spec_.update_dtype) {
      field = "update_dtype";
    }
    throw InvalidArgument(who + ": registration differs from the first registrant's in " + field);
  }
  const int64_t numel = spec_.shape.numel();
  // Everything is checked on the local copies first: a throw leaves the state as it was.
  normalize_ranges(push, numel, who, "push");
  normalize_ranges(want, numel, who, "want");
  ranks_[static_cast<size_t>(slot)] = RankRanges{rank, std::move(push), std::move(want), packed};
  return missing_ranks().empty();
}

std::vector<int> PendingRegistration::missing_ranks() const {
  std::vector<int> out;
  for (size_t i = 0; i < registrants_.size(); ++i) {
    if (!ranks_[i]) out.push_back(registrants_[i]);
  }
  return out;
}

ParameterLayout PendingRegistration::finish(bool partial) const {
  const std::string who = "parameter '" + spec_.name + "'";
  const auto missing = missing_ranks();
  if (!missing.empty()) {
    throw InvalidArgument(who + ": registration incomplete, missing ranks " +
                          rank_ids_text(missing, world_size_));
  }
  // Sweep over the boundaries of every rank's push ranges: between two consecutive boundaries
  // the contributor count is constant. Collapse equal-count neighbours into segments.
  const int64_t numel = spec_.shape.numel();
  std::vector<std::pair<int64_t, int>> events;  // (position, +1 start / -1 end)
  for (const auto& r : ranks_) {
    for (const auto& g : r->push) {
      events.emplace_back(g.begin, +1);
      events.emplace_back(g.end, -1);
    }
  }
  std::sort(events.begin(), events.end());
  struct Segment {
    int64_t begin, end;
    int count;
  };
  std::vector<Segment> segments;
  int count = 0;
  int64_t pos = 0;
  size_t e = 0;
  while (pos < numel) {
    while (e < events.size() && events[e].first == pos) count += events[e++].second;
    const int64_t next = e < events.size() ? events[e].first : numel;
    if (!segments.empty() && segments.back().count == count) {
      segments.back().end = next;
    } else {
      segments.push_back({pos, next, count});
    }
    pos = next;
  }
  if (partial) std::erase_if(segments, [](const Segment& s) { return s.count == 0; });

  for (const auto& s : segments) {
    if (s.count == 0) {
      throw InvalidArgument(who + ": elements " + range_text({s.begin, s.end}) +
                            " have no contributor (no rank pushes them)");
    }
  }
  for (const auto& s : segments) {
    if (s.count != segments.front().count) {
      const auto& f = segments.front();
      throw InvalidArgument(who + ": elements " + range_text({f.begin, f.end}) + " have " +
                            contributors_str(f.count) + ", elements " + range_text({s.begin, s.end}) +
                            " have " + contributors_str(s.count) +
                            "; every element needs the same number of contributors");
    }
  }
  ParameterLayout layout;
  layout.spec = spec_;
  // Indexed by rank id; ids between the registrants (ranks routed elsewhere) stay empty.
  layout.ranks.resize(static_cast<size_t>(registrants_.back()) + 1);
  for (size_t i = 0; i < layout.ranks.size(); ++i) layout.ranks[i].rank = static_cast<int>(i);
  for (const auto& r : ranks_) layout.ranks[static_cast<size_t>(r->rank)] = *r;
  layout.registrants = registrants_;
  layout.contributors = segments.empty() ? 0 : segments.front().count;
  return layout;
}

}  // namespace muon::daemon
