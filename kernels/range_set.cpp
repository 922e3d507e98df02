#include "kernels/range_set.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace muon {

std::string range_text(Range r) {
  return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
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
