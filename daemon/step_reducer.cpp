#include "daemon/step_reducer.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "kernels/range_set.hpp"

namespace muon::daemon {
namespace {

std::string range_str(int64_t begin, int64_t end) {
  return range_text({begin, end});
}

}  // namespace

StepReducer::StepReducer(const ParameterLayout& layout, int64_t step,
                         std::unique_ptr<ContributionStore> store)
    : layout_(layout), step_(step), ranks_(layout.ranks.size()), store_(std::move(store)) {
  if (!store_) throw InvalidArgument("StepReducer: null contribution store");
  for (size_t r = 0; r < ranks_.size(); ++r) {
    auto& st = ranks_[r];
    for (const auto& g : layout.ranks[r].push) {
      st.packed_begin.push_back(st.packed_size);
      st.packed_size += g.size();
    }
  }
}

void StepReducer::restart(int64_t step) {
  step_ = step;
  for (auto& st : ranks_) {
    st.pushed.clear();
    st.committed = false;
    st.attempt = 0;
  }
}

void StepReducer::begin_attempt(int rank, uint32_t attempt) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    throw InvalidArgument(who(rank) + ": rank outside [0, " + std::to_string(ranks_.size()) + ")");
  }
  auto& st = ranks_[static_cast<size_t>(rank)];
  if (attempt < st.attempt) {
    throw InvalidArgument(who(rank) + ": data of attempt " + std::to_string(attempt) +
                          " arrived after attempt " + std::to_string(st.attempt) +
                          " began; ignored");
  }
  if (attempt > st.attempt) {
    st.attempt = attempt;
    st.pushed.clear();  // the next push of an element copies instead of adding
    st.committed = false;
  }
}

std::string StepReducer::who(int rank) const {
  return "parameter '" + layout_.spec.name + "' step " + std::to_string(step_) + " rank " +
         std::to_string(rank);
}

StepReducer::RankState& StepReducer::writable(int rank) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    throw InvalidArgument(who(rank) + ": rank outside [0, " + std::to_string(ranks_.size()) + ")");
  }
  auto& st = ranks_[static_cast<size_t>(rank)];
  if (st.packed_size == 0) throw InvalidArgument(who(rank) + ": this rank pushes nothing");
  if (st.committed) throw InvalidArgument(who(rank) + ": already committed this step");
  return st;
}

void StepReducer::add(int rank, int64_t offset, const Contribution& values) {
  writable(rank);
  const auto& push = layout_.ranks[static_cast<size_t>(rank)].push;
  const int64_t n = values.count;
  if (n < 0) throw InvalidArgument(who(rank) + ": negative element count");
  if (n == 0) return;
  // The push range holding `offset`: the last one with begin <= offset.
  auto it = std::upper_bound(push.begin(), push.end(), offset,
                             [](int64_t off, const Range& g) { return off < g.begin; });
  if (offset < 0 || it == push.begin() || offset > std::prev(it)->end - n) {
    throw InvalidArgument(who(rank) + ": elements " + range_str(offset, offset + n) +
                          " are not inside one of the rank's push ranges");
  }
  write_piece(rank, static_cast<size_t>(std::prev(it) - push.begin()), offset, values, 0, n);
}

void StepReducer::add_packed(int rank, int64_t packed, const Contribution& values) {
  auto& st = writable(rank);
  const auto& push = layout_.ranks[static_cast<size_t>(rank)].push;
  const int64_t n = values.count;
  if (n < 0) throw InvalidArgument(who(rank) + ": negative element count");
  if (n == 0) return;
  // Checked before anything is written: a refused chunk leaves the rank's buffer as it was.
  if (!for_each_packed_piece(push, st.packed_begin, packed, n, [](auto...) {})) {
    throw InvalidArgument(who(rank) + ": packed elements " + range_str(packed, packed + n) +
                          " are not inside the rank's " + std::to_string(st.packed_size) +
                          " pushed elements");
  }
  for_each_packed_piece(push, st.packed_begin, packed, n,
                        [&](size_t index, int64_t element, int64_t pos, int64_t count) {
                          write_piece(rank, index, element, values, pos - packed, count);
                        });
}

void StepReducer::write_piece(int rank, size_t index, int64_t offset, const Contribution& values,
                              int64_t first, int64_t n) {
  auto& st = ranks_[static_cast<size_t>(rank)];
  const Range& range = layout_.ranks[static_cast<size_t>(rank)].push[index];
  // Elements this rank already pushed in this step accumulate (gradient accumulation, in push
  // order); the others are written as they come: bitwise -0 + v == v, without a fill pass over
  // the buffer. `pushed` is the rank's coverage: sorted, disjoint, merged.
  if (!st.sized) {  // once: kept across steps
    store_->resize(static_cast<size_t>(rank), st.packed_size);
    st.sized = true;
  }
  const int64_t base = st.packed_begin[index] + (offset - range.begin);  // offset's packed index
  const auto r = static_cast<size_t>(rank);
  const int64_t end = offset + n;
  auto cov = std::lower_bound(st.pushed.begin(), st.pushed.end(), offset,
                              [](const Range& c, int64_t pos) { return c.end <= pos; });
  for (int64_t pos = offset; pos < end;) {
    if (cov == st.pushed.end() || cov->begin >= end) {
      store_->write(r, base + (pos - offset), values, first + (pos - offset), end - pos, false);
      break;
    }
    if (cov->begin > pos) {
      store_->write(r, base + (pos - offset), values, first + (pos - offset), cov->begin - pos,
                    false);
      pos = cov->begin;
    }
    const int64_t stop = std::min(end, cov->end);
    store_->write(r, base + (pos - offset), values, first + (pos - offset), stop - pos, true);
    pos = stop;
    ++cov;
  }
  // Merge [offset, end) into the coverage (the common streaming case appends at the back).
  auto first_cov = std::lower_bound(st.pushed.begin(), st.pushed.end(), offset,
                                    [](const Range& c, int64_t pos) { return c.end < pos; });
  auto last = first_cov;
  Range merged{offset, end};
  while (last != st.pushed.end() && last->begin <= end) {
    merged.begin = std::min(merged.begin, last->begin);
    merged.end = std::max(merged.end, last->end);
    ++last;
  }
  first_cov = st.pushed.erase(first_cov, last);
  st.pushed.insert(first_cov, merged);
}

void StepReducer::commit(int rank) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    throw InvalidArgument(who(rank) + ": rank outside [0, " + std::to_string(ranks_.size()) + ")");
  }
  auto& st = ranks_[static_cast<size_t>(rank)];
  if (st.packed_size == 0) throw InvalidArgument(who(rank) + ": this rank pushes nothing");
  if (st.committed) throw InvalidArgument(who(rank) + ": already committed this step");
  // `pushed` is already sorted and merged by add(): walk the push ranges against it.
  const auto& merged = st.pushed;
  size_t m = 0;
  for (const auto& g : layout_.ranks[static_cast<size_t>(rank)].push) {
    int64_t pos = g.begin;  // first element of g not yet known to be covered
    while (pos < g.end) {
      while (m < merged.size() && merged[m].end <= pos) ++m;
      if (m == merged.size() || merged[m].begin > pos) {
        const int64_t gap_end = m == merged.size() ? g.end : std::min(g.end, merged[m].begin);
        throw InvalidArgument(who(rank) + ": cannot commit, elements " + range_str(pos, gap_end) +
                              " were never pushed this step");
      }
      pos = merged[m].end;
    }
  }
  st.committed = true;
}

bool StepReducer::complete() const {
  for (const auto& st : ranks_) {
    if (st.packed_size > 0 && !st.committed) return false;
  }
  return true;
}

std::vector<int> StepReducer::missing_ranks() const {
  std::vector<int> out;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].packed_size > 0 && !ranks_[r].committed) out.push_back(static_cast<int>(r));
  }
  return out;
}

void StepReducer::reduce(float* grad) {
  if (!complete()) {
    std::string list;
    for (int r : missing_ranks()) list += (list.empty() ? "" : ", ") + std::to_string(r);
    throw Error("parameter '" + layout_.spec.name + "' step " + std::to_string(step_) +
                ": cannot reduce before every contributor committed (missing ranks " + list + ")");
  }
  // -0.0f: see add(). Then ranks in ascending order, whatever order they arrived in: every
  // element's sum is (v_r0 + v_r1) + v_r2 + ..., which makes the result bitwise reproducible.
  if (layout_.contributors == 1) {  // every element has one contributor: its value, copied
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const auto& push = layout_.ranks[r].push;
      for (size_t i = 0; i < push.size(); ++i) {
        store_->read(r, ranks_[r].packed_begin[i], grad + push[i].begin, push[i].size(), false);
      }
    }
    return;
  }
  store_->fill_negative_zero(grad, layout_.spec.shape.numel());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const auto& push = layout_.ranks[r].push;
    for (size_t i = 0; i < push.size(); ++i) {
      store_->read(r, ranks_[r].packed_begin[i], grad + push[i].begin, push[i].size(), true);
    }
  }
}

}  // namespace muon::daemon
