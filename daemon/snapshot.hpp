// Momentum snapshots as safetensors files (https://github.com/huggingface/safetensors format:
// u64 little-endian header length, a JSON header, then raw little-endian tensor bytes), written
// atomically: a temporary file in the same folder, fsync, rename, fsync of the folder.
//
// Header: {"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//          "__metadata__": {"format": "muon-offload-momentum", "version": "1",
//                           "step:<name>": "<last applied step>",
//                           "options:<name>": "<MuonOptions as JSON>",
//                           "step": "<the step of every entry>",  (only when they share one)
//                           "ns_choices": "<the server's auto choices as JSON>"}}
// ns_choices (kernels/ns_choice.hpp, ns_choices_to_json) carries what NsAlgorithm::automatic ran
// for each block shape, so a server restored from the file runs the same algorithms (and gives
// the same bits) even where the machine's choice table is gone; absent in older files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/muon_options.hpp"
#include "kernels/ns_choice.hpp"

namespace muon::daemon {

/// One parameter's saved state.
struct SnapshotEntry {
  std::string name;
  std::vector<int64_t> shape;  ///< global shape as registered ([r, c] or [b, r, c])
  int64_t last_step = -1;      ///< last step applied to this momentum
  MuonOptions options;
  std::vector<float> momentum;  ///< fp32, product(shape) values
};

/// Writes all entries (and `ns_choices`, the auto choices to keep with them) atomically to `path`
/// (the file is complete and fsynced, or untouched). Throws muon::Error naming the path and the
/// OS error.
void write_snapshot(const std::string& path, const std::vector<SnapshotEntry>& entries,
                    const std::vector<NsChoiceTable::Entry>& ns_choices = {});

/// Reads a snapshot written by write_snapshot. Throws muon::InvalidArgument naming the path and
/// what is wrong for: a missing file, a truncated file, a header that is not valid JSON, a
/// dtype other than F32, data offsets that do not match the shape or lie past the end, a
/// missing format tag or step, malformed ns_choices. The auto choices stored with the entries go
/// to `*ns_choices` when given (empty for a file without them).
std::vector<SnapshotEntry> read_snapshot(const std::string& path,
                                         std::vector<NsChoiceTable::Entry>* ns_choices = nullptr);

/// The step every entry holds, or -2 when they differ (also for no entries: -2 is never a step).
int64_t common_step(const std::vector<SnapshotEntry>& entries);

/// How the entries' steps are mixed, for messages: "7 parameter(s) at step 78 ('a', 'b', ...),
/// 1 at step 77 ('c')" (the most common step first; up to 3 names each).
std::string describe_steps(const std::vector<SnapshotEntry>& entries);

}  // namespace muon::daemon
