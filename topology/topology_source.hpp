// Where the planner's Machine comes from: `auto` (live discovery on this host) or a file holding
// either a JSON description (muon-offload-topology/1) or the text of `nvidia-smi topo -m`, told
// apart by content; then the job's machine: the hosts the job runs on.
#pragma once

#include <string>
#include <string_view>

#include "topology/live_discovery.hpp"
#include "topology/machine.hpp"

namespace muon::topology {

/// A machine and a one-line description of its source ("nvidia-smi topo text hgx.txt").
struct LoadedTopology {
  Machine machine;
  std::string source;
};

/// Parses `text` as a JSON description when its first non-blank character is '{', otherwise as
/// `nvidia-smi topo -m` text. `origin` names the input in errors and in `source`.
LoadedTopology parse_topology_text(std::string_view text, std::string_view origin);

/// `spec` "auto": discover_machine(discovery); otherwise a file path read and parsed with
/// parse_topology_text. Throws InvalidArgument when the file cannot be read or parsed,
/// BackendUnavailable when `auto` finds no NVML.
LoadedTopology load_topology(const std::string& spec, const DiscoveryOptions& discovery = {});

/// The machine of a job on `nodes` hosts (0: every host of `machine`):
///  - a one-host description is replicated `nodes` times as identical hosts "node0", "node1", ...
///    (fabric cluster and clique ids are kept, so one GB200 tray replicated 18 times is one NVL72
///    domain; NICs are replicated too);
///  - a multi-host description keeps its first `nodes` hosts;
///  - an unnamed single host is named "node0".
/// Throws InvalidArgument when `nodes` exceeds the hosts of a multi-host description, or when the
/// machine has no GPU.
Machine job_machine(const Machine& machine, int nodes);

}  // namespace muon::topology
