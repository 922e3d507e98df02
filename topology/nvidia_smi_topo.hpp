// Parser for the text of `nvidia-smi topo -m` (also `--matrix`), as users paste it from real
// machines: tab-separated, sometimes indented (collect_env dumps), sometimes with two link tokens
// glued together where nvidia-smi lost a tab ("PXBNODE", "SYSSYS"), empty CPU-affinity fields,
// with or without NIC columns and the "GPU NUMA ID" column.
#pragma once

#include <string_view>

#include "topology/machine.hpp"

namespace muon::topology {

/// Parses the matrix into a Machine: one Gpu per GPU row (index from "GPU<i>", NVLink peers and
/// link counts from "NV<k>" cells, NUMA node from "NUMA Affinity"), one Nic per NIC column with
/// its link class to each GPU and its device name from the "NIC Legend". `host` is copied into
/// every GPU and NIC. nvswitch is set when every GPU pair of the host is linked with the same
/// count >= 12 on 4 or more GPUs (NV12 on DGX A100, NV18 on H100/H200/B200 HGX boards).
/// Throws InvalidArgument naming the line (1-based) and the field for: no header line, a row with
/// too few cells, an unknown link token, an asymmetric NVLink entry, a GPU row missing.
Machine parse_nvidia_smi_topo(std::string_view text, std::string_view host = "");

}  // namespace muon::topology
