#include "kernels/range_set.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace muon {

std::string range_text(Range r) {
  return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
}

std::vector<RangeBlock> blocks_of(std::span<const Range> ranges) {
  std::vector<RangeBlock> out;
  for (size_t i = 0; i < ranges.size();) {
    RangeBlock b{ranges[i], 1, 0};
    size_t j = i + 1;
    // Rows of a block never overlap (pitch >= size), whatever order the ranges come in.
    if (j < ranges.size() && ranges[j].size() == b.first.size() && b.first.size() > 0 &&
        ranges[j].begin - b.first.begin >= b.first.size()) {
      b.pitch = ranges[j].begin - b.first.begin;
      while (j < ranges.size() && ranges[j].size() == b.first.size() &&
             ranges[j].begin - ranges[j - 1].begin == b.pitch) {
        ++j;
      }
      b.rows = static_cast<int64_t>(j - i);
    }
    if (b.rows == 1) b.pitch = 0;
    out.push_back(b);
    i = j;
  }
  return out;
}

std::vector<Range> ranges_of(std::span<const RangeBlock> blocks, size_t max_ranges,
                             int64_t max_end, std::string_view label) {
  std::vector<Range> out;
  for (const auto& b : blocks) {
    const auto bad = [&](const std::string& why) {
      return InvalidArgument(std::string(label) + ": block " + range_text(b.first) + " x " +
                             std::to_string(b.rows) + " rows, pitch " + std::to_string(b.pitch) +
                             " " + why);
    };
    if (b.first.begin < 0 || b.first.end < b.first.begin || b.first.end > max_end) {
      throw bad("starts outside [0, " + std::to_string(max_end) + ")");
    }
    if (b.rows < 1) throw bad("has fewer than one row");
    if (b.rows > 1) {
      if (b.first.size() == 0) throw bad("repeats an empty range");
      if (b.pitch < b.first.size()) throw bad("has overlapping rows (pitch below the row size)");
      // The last row's end, checked without overflow: (rows - 1) * pitch <= max_end - end.
      if (b.pitch > (max_end - b.first.end) / (b.rows - 1)) {
        throw bad("ends outside [0, " + std::to_string(max_end) + ")");
      }
    }
    if (static_cast<uint64_t>(b.rows) > max_ranges - out.size()) {
      throw bad("makes more than " + std::to_string(max_ranges) + " ranges in all");
    }
    for (int64_t r = 0; r < b.rows; ++r) {
      out.push_back({b.first.begin + r * b.pitch, b.first.end + r * b.pitch});
    }
  }
  return out;
}

std::vector<int64_t> packed_starts(std::span<const Range> ranges) {
  std::vector<int64_t> prefix;
  prefix.reserve(ranges.size());
  int64_t pos = 0;
  for (const auto& r : ranges) {
    prefix.push_back(pos);
    pos += r.size();
  }
  return prefix;
}

RangeSet::RangeSet(std::vector<Range> sorted_disjoint) : ranges_(std::move(sorted_disjoint)) {
  reindex(0);
}

void RangeSet::reindex(size_t from) {
  prefix_.resize(ranges_.size());
  int64_t pos = from == 0 ? 0 : prefix_[from - 1] + ranges_[from - 1].size();
  for (size_t i = from; i < ranges_.size(); ++i) {
    prefix_[i] = pos;
    pos += ranges_[i].size();
  }
}

RangeSet RangeSet::disjoint(std::vector<Range> ranges, int64_t numel, std::string_view label) {
  for (const auto& r : ranges) {
    if (r.begin < 0 || r.end < r.begin || r.end > numel) {
      throw InvalidArgument(std::string(label) + " range " + range_text(r) + " is not inside [0, " +
                            std::to_string(numel) + ")");
    }
  }
  std::erase_if(ranges, [](const Range& r) { return r.size() == 0; });
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      throw InvalidArgument(std::string(label) + " ranges " + range_text(ranges[i - 1]) + " and " +
                            range_text(ranges[i]) + " overlap");
    }
  }
  return RangeSet(std::move(ranges));
}

RangeSet RangeSet::union_of(std::vector<Range> ranges) {
  std::erase_if(ranges, [](const Range& r) { return r.size() <= 0; });
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return RangeSet(std::move(out));
}

void RangeSet::add(Range r) {
  if (r.size() <= 0) return;
  // The first range that ends at or after r.begin: it and the ones after it that start at or
  // before r.end merge with r (the common streaming case appends at the back).
  auto first = std::lower_bound(ranges_.begin(), ranges_.end(), r.begin,
                                [](const Range& x, int64_t pos) { return x.end < pos; });
  auto last = first;
  while (last != ranges_.end() && last->begin <= r.end) {
    r.begin = std::min(r.begin, last->begin);
    r.end = std::max(r.end, last->end);
    ++last;
  }
  const auto at = static_cast<size_t>(first - ranges_.begin());
  first = ranges_.erase(first, last);
  ranges_.insert(first, r);
  reindex(at);
}

std::optional<int64_t> RangeSet::packed_offset(int64_t offset, int64_t count) const {
  if (count < 0) return std::nullopt;
  // The last range with begin <= offset.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), offset,
                             [](int64_t off, const Range& r) { return off < r.begin; });
  if (it == ranges_.begin()) return std::nullopt;
  --it;
  if (offset > it->end - count) return std::nullopt;
  return prefix_[static_cast<size_t>(it - ranges_.begin())] + (offset - it->begin);
}

std::optional<int64_t> RangeSet::chunk_position(int64_t offset, int64_t count,
                                                bool packed) const {
  if (!packed) return packed_offset(offset, count);
  if (offset < 0 || count < 0 || offset > elements() - count) return std::nullopt;
  return offset;
}

void RangeSet::scatter(const void* packed, void* full, size_t elem_bytes) const {
  const auto* src = static_cast<const std::byte*>(packed);
  auto* dst = static_cast<std::byte*>(full);
  for (size_t i = 0; i < ranges_.size(); ++i) {
    std::memcpy(dst + static_cast<size_t>(ranges_[i].begin) * elem_bytes,
                src + static_cast<size_t>(prefix_[i]) * elem_bytes,
                static_cast<size_t>(ranges_[i].size()) * elem_bytes);
  }
}

void RangeSet::gather(const void* full, void* packed, size_t elem_bytes) const {
  const auto* src = static_cast<const std::byte*>(full);
  auto* dst = static_cast<std::byte*>(packed);
  for (size_t i = 0; i < ranges_.size(); ++i) {
    std::memcpy(dst + static_cast<size_t>(prefix_[i]) * elem_bytes,
                src + static_cast<size_t>(ranges_[i].begin) * elem_bytes,
                static_cast<size_t>(ranges_[i].size()) * elem_bytes);
  }
}

}  // namespace muon
