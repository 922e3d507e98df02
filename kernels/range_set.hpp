// Element ranges over a parameter's flattened elements: what a rank pushes or wants back (its
// storage layout), a step's coverage, the union of every rank's ranges. RangeSet is the one home
// of the range algebra: normalizing, merging, packing (a set's ranges laid end to end, as the
// data plane carries them), scattering back, cutting a packed span at range boundaries, and the
// blocks (a row range x a column range of a matrix: equal ranges at a fixed pitch) that describe
// many ranges at once on the wire.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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

/// `rows` copies of range `first`, `pitch` elements apart: row i is [first.begin + i * pitch,
/// first.end + i * pitch). The column block of a row-major matrix that a column shard holds (rows
/// [r0, r1) x columns [c0, c1) of a matrix of C columns: first [r0 * C + c0, r0 * C + c1), rows
/// r1 - r0, pitch C) is one block instead of r1 - r0 ranges. A single range is rows 1.
struct RangeBlock {
  Range first;
  int64_t rows = 1;
  int64_t pitch = 0;
  bool operator==(const RangeBlock&) const = default;
};

/// `ranges` (sorted, disjoint, non-empty) as the fewest blocks that runs of equal-size, equally
/// spaced ranges make, in order: ranges_of(blocks_of(r)) == r.
std::vector<RangeBlock> blocks_of(std::span<const Range> ranges);
/// The ranges of `blocks`, in order. Throws InvalidArgument (naming `label`, e.g. "field 'push'")
/// for a block with rows < 1, an empty range repeated, rows that overlap (pitch < size), an
/// element outside [0, max_end), or more than `max_ranges` ranges in all; nothing is allocated
/// for a block before it is checked.
std::vector<Range> ranges_of(std::span<const RangeBlock> blocks, size_t max_ranges,
                             int64_t max_end, std::string_view label);

/// Cuts the packed span [packed, packed + count) of sorted, disjoint `ranges` (laid end to end:
/// range i starts at packed position prefix[i]) at range boundaries and calls
/// f(range index, element, packed position, elements) for each piece, in order: a push or an
/// update chunk that spans several ranges of a rank (a column block's rows) is scattered this
/// way. Returns false, calling nothing, when count < 0 or the span is not inside the packed
/// elements; count 0 at a valid position calls nothing and returns true.
template <class F>
bool for_each_packed_piece(std::span<const Range> ranges, std::span<const int64_t> prefix,
                           int64_t packed, int64_t count, F&& f) {
  const int64_t total = ranges.empty() ? 0 : prefix.back() + ranges.back().size();
  if (count < 0 || packed < 0 || packed > total - count) return false;
  // The last range whose packed start is <= packed.
  size_t i = static_cast<size_t>(std::upper_bound(prefix.begin(), prefix.end(), packed) -
                                 prefix.begin());
  i = i == 0 ? 0 : i - 1;
  for (int64_t pos = packed, end = packed + count; pos < end; ++i) {
    const int64_t in = pos - prefix[i];
    const int64_t n = std::min(end - pos, ranges[i].size() - in);
    if (n <= 0) continue;  // pos is at the end of range i: the piece starts in the next one
    f(i, ranges[i].begin + in, pos, n);
    pos += n;
  }
  return true;
}

/// prefix[i]: where range i starts when `ranges` are laid end to end.
std::vector<int64_t> packed_starts(std::span<const Range> ranges);

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
  /// Where a received chunk of `count` elements lands in the set's packed layout: its `offset`
  /// is an element (packed_offset), or with `packed` already a packed position, which must lie in
  /// [0, elements() - count]. nullopt when it does not land inside (the chunk is not kept).
  std::optional<int64_t> chunk_position(int64_t offset, int64_t count, bool packed) const;

  /// dst[r.begin .. r.end) = packed[pos .. pos + r.size()) for each range (elements of
  /// `elem_bytes` bytes; `packed` holds elements() of them, `full` the whole parameter).
  void scatter(const void* packed, void* full, size_t elem_bytes) const;
  /// The reverse: the set's elements of `full` laid end to end into `packed`.
  void gather(const void* full, void* packed, size_t elem_bytes) const;

  /// for_each_packed_piece over this set.
  template <class F>
  bool for_each_piece(int64_t packed, int64_t count, F&& f) const {
    return for_each_packed_piece(ranges_, prefix_, packed, count, std::forward<F>(f));
  }

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
