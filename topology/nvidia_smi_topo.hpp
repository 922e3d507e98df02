// Parser for the text of `nvidia-smi topo -m` (also `--matrix`, `-mp`) as users paste it from real
// machines: tab-separated as nvidia-smi prints it, or with the tabs turned into runs of spaces (a
// terminal copy) or into single spaces (a web page); indented (collect_env dumps, Markdown); with
// the header's ANSI underline/bold escapes, with or without their ESC byte (web pages drop it);
// CRLF line ends, a UTF-8 BOM, no-break spaces; two link tokens glued together where nvidia-smi
// lost a tab ("PXBNODE", "SYSSYS"); empty CPU-affinity fields; NIC columns named NIC<j> (with a
// "NIC Legend") or by device (mlx5_0, older drivers); with or without the "NUMA Affinity" and
// "GPU NUMA ID" columns. Every form parses to the same Machine as the tab-separated original.
#pragma once

#include <string_view>

#include "topology/machine.hpp"

namespace muon::topology {

/// Parses the matrix into a Machine: one Gpu per GPU row (index from "GPU<i>", NVLink peers and
/// link counts from "NV<k>" cells, NUMA node from "NUMA Affinity"; a range "0-1" gives its first
/// node, "N/A" gives -1), one Nic per NIC column (link class to each GPU from the GPU rows, checked
/// against the NIC's own row when there is one; device name from the "NIC Legend", or the column
/// name itself when the column is named by device). `host` is copied into every GPU and NIC.
/// nvswitch is set when every GPU pair of the host is linked with the same count >= 12 on 4 or more
/// GPUs (NV12 on DGX A100, NV18 on H100/H200/B200 HGX boards).
///
/// Cells are separated by any run of tabs and spaces, so empty cells vanish; a GPU row with fewer
/// trailing fields than the header has columns is missing its leading ones (nvidia-smi leaves the
/// CPU affinity empty on some virtual machines, and prints "N/A" for the others). The matrix ends
/// at the "Legend:" line; only "NIC<j>: <device>" entries are read after it.
///
/// Throws InvalidArgument naming the line (1-based) and the field for: no header line, a matrix
/// row before any header, an unknown or repeated header column, a row with too few or too many
/// cells, an unknown link token, a malformed affinity or NUMA field, a repeated row, an asymmetric
/// NVLink entry, a NIC row that disagrees with the GPU rows, a GPU column without its row.
Machine parse_nvidia_smi_topo(std::string_view text, std::string_view host = "");

}  // namespace muon::topology
