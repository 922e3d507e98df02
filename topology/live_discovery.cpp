#include "topology/live_discovery.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "topology/nvml_library.hpp"

namespace muon::topology {
namespace {

std::string local_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// <sysfs>/bus/pci/devices/<bdf>/numa_node: "-1" on single-node machines, absent in containers.
int sysfs_numa_node(const std::string& root, const std::string& bus_id) {
  std::ifstream f(root + "/bus/pci/devices/" + bus_id + "/numa_node");
  int node = -1;
  if (f >> node) return node < 0 ? -1 : node;
  return -1;
}

}  // namespace

Machine discover_machine(const DiscoveryOptions& options) {
  NvmlLibrary nvml(options.nvml_library);
  const std::string host = options.host.empty() ? local_host_name() : options.host;
  const unsigned count = nvml.device_count();

  Machine machine;
  std::vector<nvmlDevice_t> devices;
  std::map<std::string, int> index_of_bus;  // normalized bus id -> GPU index
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t d = nvml.device(i);
    Gpu gpu;
    gpu.index = static_cast<int>(i);
    gpu.host = host;
    gpu.pci_bus_id = nvml.pci_bus_id(d);
    if (auto node = nvml.numa_node(d)) {
      gpu.numa_node = *node;
    } else {
      gpu.numa_node = sysfs_numa_node(options.sysfs_root, gpu.pci_bus_id);
    }
    if (auto name = nvml.device_name(d)) gpu.model = *name;
    if (auto memory = nvml.memory_total(d)) gpu.memory_bytes = *memory;
    if (auto fabric = nvml.fabric_info(d)) {
      gpu.fabric_cluster = fabric->cluster;
      gpu.fabric_clique = fabric->clique;
    }
    index_of_bus[gpu.pci_bus_id] = gpu.index;
    devices.push_back(d);
    machine.gpus.push_back(gpu);
  }

  std::vector<int> switch_links(count, 0);
  for (unsigned i = 0; i < count; ++i) {
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      if (!nvml.nvlink_active(devices[i], link)) continue;
      const std::string remote = nvml.nvlink_remote_bus_id(devices[i], link);
      const auto local = index_of_bus.find(remote);
      const auto type = nvml.nvlink_remote_type(devices[i], link);
      const bool to_gpu = type ? *type == NVML_NVLINK_DEVICE_TYPE_GPU : local != index_of_bus.end();
      if (to_gpu && local != index_of_bus.end() && local->second != static_cast<int>(i)) {
        machine.gpus[i].nvlink_peers[local->second] += 1;
      } else if (!to_gpu && (!type || *type == NVML_NVLINK_DEVICE_TYPE_SWITCH)) {
        switch_links[i] += 1;
      }
      // A GPU link to a GPU outside this host's NVML view, or an IBM NPU: not a peer here.
    }
  }
  for (unsigned i = 0; i < count; ++i) {
    if (switch_links[i] == 0) continue;
    machine.gpus[i].nvswitch = true;
    for (unsigned j = 0; j < count; ++j) {
      if (j == i || switch_links[j] == 0) continue;
      int& links = machine.gpus[i].nvlink_peers[static_cast<int>(j)];
      links = std::max(links, std::min(switch_links[i], switch_links[j]));
    }
  }
  return machine;
}

}  // namespace muon::topology
