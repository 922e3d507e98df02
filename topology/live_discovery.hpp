// Live discovery of the local machine through NVML (loaded at run time) and sysfs: the source
// behind `--topology auto`. No CUDA runtime is needed, so it also runs where no CUDA context can
// be created (a login node with the driver, a container without device access to CUDA).
#pragma once

#include <string>

#include "topology/machine.hpp"

namespace muon::topology {

struct DiscoveryOptions {
  /// NVML library to load; empty: nvml_library_path() ($MUON_NVML_LIBRARY or libnvidia-ml.so.1).
  std::string nvml_library;
  /// Root of sysfs, for the NUMA node fallback <sysfs_root>/bus/pci/devices/<bdf>/numa_node.
  std::string sysfs_root = "/sys";
  /// Host name written into every GPU; empty: gethostname().
  std::string host;
};

/// Describes this host's GPUs:
///  - index, PCI bus id (NVML order, which is PCI order, as CUDA_DEVICE_ORDER=PCI_BUS_ID counts);
///  - NUMA node from nvmlDeviceGetNumaNodeId, else sysfs, else -1;
///  - NVLink: each active link (nvmlDeviceGetNvLinkState) is classified by its far end
///    (nvmlDeviceGetNvLinkRemoteDeviceType; without it, a far end whose bus id is a local GPU is
///    that GPU, anything else a switch). Direct GPU links count per peer. GPUs with switch links
///    are marked nvswitch and linked to every other switch-connected GPU of the host with
///    min(own switch links, peer's switch links), as `nvidia-smi topo -m` prints NV18 on HGX;
///  - fabric cluster UUID and clique id (GB200 NVL72) from nvmlDeviceGetGpuFabricInfo(V);
///  - the device name and total memory (nvmlDeviceGetName, nvmlDeviceGetMemoryInfo), from which
///    the planner takes the GPU model's rates (plan/gpu_model.hpp); left empty when unavailable.
/// NICs are not discovered (NVML does not list them). Throws BackendUnavailable when NVML cannot
/// be loaded or initialized, DeviceError when an NVML call fails.
Machine discover_machine(const DiscoveryOptions& options = {});

}  // namespace muon::topology
