// libFuzzer harness: registration validation (daemon/registration.hpp) with shapes, world sizes,
// dtypes, options JSON (transport::options_from_json) and every rank's push/want ranges taken from
// the fuzz input (registration_input.hpp).
//
// Invariants, each a crash when broken:
// - PendingRegistration's constructor, add() and finish() throw only InvalidArgument (their
//   documented error); options_from_json throws only ProtocolError;
// - an accepted spec has world_size >= 1, a positive shape of at most 2^40 elements and row
//   blocks that are positive and add up to the rows (summed without overflow);
// - add() refuses exactly what a reference check refuses (rank outside [0, world), a spec that
//   differs, a range outside [0, numel) or reversed, ranges overlapping within the rank), leaves
//   the state unchanged when it throws, and returns whether every rank has registered;
// - finish() succeeds exactly when every rank registered and every element has the same,
//   non-zero number of contributors (computed here independently), and the layout's ranges are
//   the ranks' ranges sorted, non-empty, inside [0, numel) and disjoint within a rank.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/error.hpp"
#include "daemon/registration.hpp"
#include "kernels/muon_options.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/registration_input.hpp"
#include "transport/messages.hpp"

namespace {

using namespace muon;
using namespace muon::daemon;
using transport::DType;
using transport::Range;

constexpr int64_t kMaxElements = int64_t{1} << 40;

// The ranges add() should keep (sorted, empties dropped), or nullopt when it must refuse them.
std::optional<std::vector<Range>> reference_normalize(std::vector<Range> ranges, int64_t numel) {
  for (const auto& g : ranges) {
    if (g.begin < 0 || g.end < g.begin || g.end > numel) return std::nullopt;
  }
  std::vector<Range> kept;
  for (const auto& g : ranges)
    if (g.end > g.begin) kept.push_back(g);
  std::sort(kept.begin(), kept.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < kept.size(); ++i) {
    if (kept[i].begin < kept[i - 1].end) return std::nullopt;
  }
  return kept;
}

// The uniform contributor count over [0, numel), or 0 when some element has none or counts
// differ. Difference array over the sorted boundaries (the code under test sweeps sorted events).
int reference_contributors(const std::vector<std::vector<Range>>& push, int64_t numel) {
  std::vector<int64_t> cuts = {0, numel};
  for (const auto& rank : push) {
    for (const auto& g : rank) {
      cuts.push_back(g.begin);
      cuts.push_back(g.end);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  auto index = [&](int64_t x) {
    return static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), x) - cuts.begin());
  };
  std::vector<int> diff(cuts.size() + 1, 0);
  for (const auto& rank : push) {
    for (const auto& g : rank) {
      ++diff[index(g.begin)];
      --diff[index(g.end)];
    }
  }
  int count = 0, uniform = -1;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {  // the piece [cuts[i], cuts[i+1])
    count += diff[i];
    if (cuts[i] >= numel) break;
    if (count == 0 || (uniform >= 0 && count != uniform)) return 0;
    uniform = count;
  }
  return uniform;
}

bool same_ranges(const std::vector<Range>& a, const std::vector<Range>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const Range& x, const Range& y) {
    return x.begin == y.begin && x.end == y.end;
  });
}

// The spec of one add() call: the first registrant's, changed per `changes` (registration_input).
ParameterSpec changed_spec(const ParameterSpec& spec, uint8_t changes) {
  ParameterSpec s = spec;
  if (changes & 1) s.name += ".other";
  if (changes & 2) s.shape.rows ^= 1;  // a different row count without overflow
  if (changes & 4) s.grad_dtype = s.grad_dtype == DType::f32 ? DType::bf16 : DType::f32;
  if (changes & 8) s.options.momentum.mu = s.options.momentum.mu == 0.5f ? 0.25f : 0.5f;
  return s;
}

void check_accepted_spec(const ParameterSpec& spec, int world_size) {
  const auto& s = spec.shape;
  FUZZ_CHECK(world_size >= 1);
  FUZZ_CHECK(s.batch > 0 && s.rows > 0 && s.cols > 0);
  FUZZ_CHECK(static_cast<__int128>(s.batch) * s.rows * s.cols <= kMaxElements);
  std::vector<int64_t> blocks;
  try {
    blocks = row_blocks(spec.options.orthogonalize, s, spec.name);
  } catch (const InvalidArgument&) {
    FUZZ_CHECK(!"row_blocks refused a spec PendingRegistration accepted");
  }
  __int128 total = 0;
  for (const auto b : blocks) {
    FUZZ_CHECK(b > 0);
    total += b;
  }
  FUZZ_CHECK(total == s.rows);
}

void check_layout(const ParameterLayout& layout, const std::vector<std::vector<Range>>& push,
                  const std::vector<std::vector<Range>>& want, int64_t numel) {
  FUZZ_CHECK(layout.ranks.size() == push.size());
  for (size_t r = 0; r < layout.ranks.size(); ++r) {
    const auto& rr = layout.ranks[r];
    FUZZ_CHECK(rr.rank == static_cast<int>(r));
    FUZZ_CHECK(same_ranges(rr.push, push[r]));
    FUZZ_CHECK(same_ranges(rr.want, want[r]));
    for (const auto* list : {&rr.push, &rr.want}) {
      for (size_t i = 0; i < list->size(); ++i) {
        const auto& g = (*list)[i];
        FUZZ_CHECK(0 <= g.begin && g.begin < g.end && g.end <= numel);
        if (i > 0) FUZZ_CHECK((*list)[i - 1].end <= g.begin);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto in = fuzz::parse_registration_input(std::span<const uint8_t>(data, size));
  if (!in) return 0;

  ParameterSpec spec;
  spec.name = "fuzz.w";
  spec.shape = {in->batch, in->rows, in->cols};
  spec.grad_dtype = (in->dtypes & 1) ? DType::bf16 : DType::f32;
  spec.update_dtype = (in->dtypes & 2) ? DType::bf16 : DType::f32;
  if (!in->options_json.empty()) {
    try {
      spec.options = transport::options_from_json(in->options_json);
    } catch (const transport::ProtocolError&) {
      return 0;
    }
  }

  std::optional<PendingRegistration> reg;
  try {
    reg.emplace(spec, in->world_size);
  } catch (const InvalidArgument&) {
    return 0;
  }
  check_accepted_spec(spec, in->world_size);
  const int64_t numel = spec.shape.numel();
  const auto world = static_cast<size_t>(in->world_size);

  std::vector<bool> registered(world, false);
  std::vector<std::vector<Range>> push(world), want(world);
  for (const auto& call : in->calls) {
    const ParameterSpec s = changed_spec(spec, call.spec_changes);
    const bool rank_ok = call.rank >= 0 && call.rank < in->world_size;
    const auto p = reference_normalize(call.push, numel);
    const auto w = reference_normalize(call.want, numel);
    const bool acceptable = rank_ok && (call.spec_changes & 15) == 0 && p && w;
    const auto missing_before = reg->missing_ranks();
    bool complete = false;
    try {
      complete = reg->add(call.rank, s, call.push, call.want);
    } catch (const InvalidArgument&) {
      FUZZ_CHECK(!acceptable);
      FUZZ_CHECK(reg->missing_ranks() == missing_before);
      continue;
    }
    FUZZ_CHECK(acceptable);
    const auto r = static_cast<size_t>(call.rank);
    registered[r] = true;
    push[r] = *p;
    want[r] = *w;
    const bool all = std::all_of(registered.begin(), registered.end(), [](bool b) { return b; });
    FUZZ_CHECK(complete == all);
    FUZZ_CHECK(reg->missing_ranks().empty() == all);
  }

  const bool all = std::all_of(registered.begin(), registered.end(), [](bool b) { return b; });
  const int expected = all ? reference_contributors(push, numel) : 0;
  try {
    const ParameterLayout layout = reg->finish();
    FUZZ_CHECK(expected > 0);
    FUZZ_CHECK(layout.contributors == expected);
    check_layout(layout, push, want, numel);
  } catch (const InvalidArgument&) {
    FUZZ_CHECK(expected == 0);
  }
  return 0;
}
