// The JSON description of a machine, schema "muon-offload-topology/1": what a user writes for a
// cluster the planner cannot see (a GB200 NVL72 rack, several HGX nodes), and what
// `topology auto` discovery can save. One file, hosts with their GPUs and NICs:
//
//   {
//     "schema": "muon-offload-topology/1",
//     "hosts": [
//       { "name": "node0",
//         "gpus": [
//           { "index": 0, "pci_bus_id": "0000:18:00.0", "numa_node": 0, "nvswitch": true,
//             "model": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984,
//             "nvlink": [ { "peer": 1, "links": 18 }, ... ],
//             "fabric": { "cluster": "9f1c...-uuid", "clique": 1 } },     // NVL72 only
//           ... ],
//         "nics": [ { "name": "NIC0", "device": "mlx5_0", "gpu_link": { "0": "PIX", ... } } ] }
//     ]
//   }
//
// Required: schema, hosts[].name, hosts[].gpus[].index. Everything else is optional and defaults
// to "unknown" (numa_node -1, no NVLink, no fabric, no model name or memory size: the planner
// then infers the GPU model from the links, plan/gpu_model.hpp). Unknown fields are errors, so a
// typo never passes silently. `nvlink` lists peers on the same host (GPU index -> bonded link
// count) and must be symmetric.
#pragma once

#include <string>
#include <string_view>

#include "topology/machine.hpp"

namespace muon::topology {

/// The schema string this reader accepts and this writer emits.
inline constexpr std::string_view kTopologySchema = "muon-offload-topology/1";

/// Parses a JSON topology description into a Machine (GPUs ordered by host, then as listed).
/// `origin` (a file name) prefixes error messages. Throws InvalidArgument naming the line and
/// column for a JSON syntax error, and the field path ("hosts[1].gpus[3].nvlink[0].links") for a
/// missing, mistyped, out-of-range, unknown or inconsistent field (duplicate host or GPU index,
/// an NVLink peer that is not on the host, an asymmetric NVLink entry, a malformed PCI bus id,
/// a schema other than muon-offload-topology/1).
Machine parse_topology_json(std::string_view text, std::string_view origin = "topology JSON");

/// Writes `machine` as a muon-offload-topology/1 document (2-space indent, trailing newline).
/// GPUs with an empty host go under host "" (a single-host description). Round-trips:
/// parse_topology_json(write_topology_json(m)) == m for a machine whose GPUs are grouped by host.
std::string write_topology_json(const Machine& machine);

}  // namespace muon::topology
