// The machine model the planner works on: GPUs with their PCI ids, NUMA nodes, NVLink peers and
// fabric (NVL72) clique membership, and the NICs next to them. Filled from live discovery, from
// `nvidia-smi topo -m` text, or from a JSON description; one struct, whatever the source.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace muon::topology {

/// One GPU as the planner sees it.
struct Gpu {
  int index = 0;           ///< index within its host, as CUDA_VISIBLE_DEVICES counts
  std::string host;        ///< host name; empty for a single-host description
  std::string pci_bus_id;  ///< "0000:18:00.0"; empty when the source does not say
  int numa_node = -1;      ///< -1 when unknown
  /// NVLink peers on the same host: peer index -> number of links (a bonded set "NV18" is 18).
  std::map<int, int> nvlink_peers;
  bool nvswitch = false;       ///< links go through NVSwitch (HGX/DGX, NVL72)
  std::string fabric_cluster;  ///< GPU fabric cluster UUID (NVL72); empty when none
  int fabric_clique = -1;      ///< GPU fabric clique id within the cluster; -1 when none
  /// Device name as NVML and nvidia-smi print it ("NVIDIA H100 80GB HBM3"); empty when unknown.
  std::string model;
  int64_t memory_bytes = 0;  ///< total device memory, bytes; 0 when unknown

  bool operator==(const Gpu&) const = default;
};

/// One network interface card as `nvidia-smi topo -m` lists it.
struct Nic {
  std::string name;    ///< "NIC0"
  std::string device;  ///< "mlx5_0" from the NIC legend; empty when unknown
  std::string host;
  /// Link class to each GPU index: "PIX", "PXB", "PHB", "NODE", "SYS".
  std::map<int, std::string> gpu_link;

  bool operator==(const Nic&) const = default;
};

/// A machine or a set of machines (an NVL72 rack spans 18 hosts).
struct Machine {
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;

  bool operator==(const Machine&) const = default;
};

/// The distinct host names of a machine, in the order their first GPU appears.
inline std::vector<std::string> host_names(const Machine& machine) {
  std::vector<std::string> hosts;
  for (const auto& g : machine.gpus) {
    bool seen = false;
    for (const auto& h : hosts) seen = seen || h == g.host;
    if (!seen) hosts.push_back(g.host);
  }
  return hosts;
}

}  // namespace muon::topology
