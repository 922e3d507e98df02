// Element ranges over a parameter's flattened elements: what a rank pushes or wants back (its
// storage layout), a step's coverage, the union of every rank's ranges. RangeSet is the one home
// of the range algebra: normalizing, merging, packing (a set's ranges laid end to end, as the
// data plane carries them) and scattering back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace muon {

/// A half-open element range [begin, end) over a parameter's flattened elements.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

/// "[begin, end)".
std::string range_text(Range r);

/// Sorted, disjoint, non-empty ranges, and their packed positions: packed(i) is where range i
/// starts when the ranges are laid end to end (the order of a rank's bytes on the data plane).
class RangeSet {
 public:
  RangeSet() = default;

  /// A rank's ranges, which must not overlap: empty ones dropped, sorted by begin. Throws
  /// InvalidArgument "<label> range [b, e) is not inside [0, numel)" or "<label> ranges [a, b) and
  /// [c, d) overlap" (label e.g. "parameter 'w' rank 1: push").
  static RangeSet disjoint(std::vector<Range> ranges, int64_t numel, std::string_view label);
  /// The union of any ranges: sorted, with overlapping and touching ones merged.
  static RangeSet union_of(std::vector<Range> ranges);

  /// Adds [r.begin, r.end) to the set, merging with the ranges it overlaps or touches.
  void add(Range r);

  const std::vector<Range>& ranges() const { return ranges_; }
  bool empty() const { return ranges_.empty(); }
  /// Elements in the set (the packed size).
  int64_t elements() const { return prefix_.empty() ? 0 : prefix_.back() + ranges_.back().size(); }
  /// True when [offset, offset + count) lies inside the set (count 0: offset inside or at an end).
  bool covers(int64_t offset, int64_t count) const { return packed_offset(offset, count).has_value(); }
  /// The packed position of element `offset` when [offset, offset + count) lies inside one range
  /// of the set; nullopt otherwise (count >= 0).
  std::optional<int64_t> packed_offset(int64_t offset, int64_t count) const;

  /// dst[r.begin .. r.end) = packed[pos .. pos + r.size()) for each range (elements of
  /// `elem_bytes` bytes; `packed` holds elements() of them, `full` the whole parameter).
  void scatter(const void* packed, void* full, size_t elem_bytes) const;
  /// The reverse: the set's elements of `full` laid end to end into `packed`.
  void gather(const void* full, void* packed, size_t elem_bytes) const;

  /// Calls f(range, packed position) for each range, in order.
  template <class F>
  void for_each_packed(F&& f) const {
    for (size_t i = 0; i < ranges_.size(); ++i) f(ranges_[i], prefix_[i]);
  }

  bool operator==(const RangeSet& other) const { return ranges_ == other.ranges_; }

 private:
  explicit RangeSet(std::vector<Range> sorted_disjoint);
  void reindex(size_t from);

  std::vector<Range> ranges_;
  std::vector<int64_t> prefix_;  // packed position of each range
};

}  // namespace muon
