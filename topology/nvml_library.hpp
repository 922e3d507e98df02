// NVML loaded at run time (NCCL's nvmlwrap pattern): dlopen the library, resolve the few entry
// points of topology/nvml_stub.hpp, nvmlInit_v2; on destruction nvmlShutdown and dlclose, in
// that order. Every call goes through MUON_NVML_CHECK, which reports the call, the NVML error
// string and the file:line. A machine without NVML gets a BackendUnavailable error, never a crash.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "topology/nvml_stub.hpp"

namespace muon::topology {

/// Where NVML is looked for: $MUON_NVML_LIBRARY when set and non-empty, else
/// "libnvidia-ml.so.1" (the name the driver installs; found through the loader's search path).
std::string nvml_library_path();

/// GPU fabric (NVL72 / multi-node NVLink) membership of one GPU.
struct FabricInfo {
  std::string cluster;  ///< cluster UUID as 8-4-4-4-12 lower-case hex
  int clique = -1;
};

/// One loaded, initialized NVML. Not copyable; one per discovery.
class NvmlLibrary {
 public:
  /// Loads `path` (empty: nvml_library_path()) and initializes NVML. Throws BackendUnavailable
  /// naming the path when dlopen fails, when a required entry point is missing, or when
  /// nvmlInit_v2 fails (driver not loaded, version mismatch), with NVML's error string.
  explicit NvmlLibrary(std::string path = {});
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const std::string& path() const { return path_; }

  /// Number of GPUs NVML sees. Throws DeviceError on failure (as do the calls below).
  unsigned device_count() const;
  nvmlDevice_t device(unsigned index) const;
  /// "0000:18:00.0": NVML's bus id with a 4-digit domain, lower-case hex, as sysfs names it.
  std::string pci_bus_id(nvmlDevice_t device) const;
  /// Whether NVLink `link` (0 .. NVML_NVLINK_MAX_LINKS-1) is active; false when the GPU has no
  /// such link (NOT_SUPPORTED, INVALID_ARGUMENT).
  bool nvlink_active(nvmlDevice_t device, unsigned link) const;
  /// Bus id of the device at the far end of an active link (a GPU or an NVSwitch).
  std::string nvlink_remote_bus_id(nvmlDevice_t device, unsigned link) const;
  /// What the far end of an active link is; nullopt when this NVML lacks the entry point.
  std::optional<nvmlIntNvLinkDeviceType_t> nvlink_remote_type(nvmlDevice_t device,
                                                              unsigned link) const;
  /// Fabric cluster and clique once the GPU has registered with the fabric manager (state
  /// COMPLETED, status SUCCESS, a non-zero cluster UUID); nullopt otherwise, including on GPUs
  /// and drivers without fabric support. Uses nvmlDeviceGetGpuFabricInfoV when present, else
  /// nvmlDeviceGetGpuFabricInfo.
  std::optional<FabricInfo> fabric_info(nvmlDevice_t device) const;
  /// NUMA node closest to the GPU per nvmlDeviceGetNumaNodeId; nullopt when unavailable.
  std::optional<int> numa_node(nvmlDevice_t device) const;
  /// The device name ("NVIDIA H100 80GB HBM3") per nvmlDeviceGetName; nullopt when unavailable.
  std::optional<std::string> device_name(nvmlDevice_t device) const;
  /// Total device memory in bytes per nvmlDeviceGetMemoryInfo; nullopt when unavailable.
  std::optional<int64_t> memory_total(nvmlDevice_t device) const;

  /// NVML's text for `rc` ("Driver Not Loaded"), or "NVML error <rc>".
  std::string error_string(nvmlReturn_t rc) const;

 private:
  std::string path_;
  void* handle_ = nullptr;
  bool initialized_ = false;
  nvmlInit_v2_fn init_ = nullptr;
  nvmlShutdown_fn shutdown_ = nullptr;
  nvmlErrorString_fn error_string_ = nullptr;
  nvmlDeviceGetCount_v2_fn get_count_ = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn get_handle_ = nullptr;
  nvmlDeviceGetPciInfo_v3_fn get_pci_ = nullptr;
  nvmlDeviceGetNvLinkState_fn get_link_state_ = nullptr;
  nvmlDeviceGetNvLinkRemotePciInfo_v2_fn get_remote_pci_ = nullptr;
  nvmlDeviceGetNvLinkRemoteDeviceType_fn get_remote_type_ = nullptr;
  nvmlDeviceGetGpuFabricInfo_fn get_fabric_ = nullptr;
  nvmlDeviceGetGpuFabricInfoV_fn get_fabric_v_ = nullptr;
  nvmlDeviceGetNumaNodeId_fn get_numa_ = nullptr;
  nvmlDeviceGetName_fn get_name_ = nullptr;
  nvmlDeviceGetMemoryInfo_fn get_memory_ = nullptr;
};

/// "00000000:1A:00.0" or "0000:1a:00.0" -> "0000:1a:00.0" (4-digit domain, lower case).
std::string normalize_pci_bus_id(std::string_view bus_id);

}  // namespace muon::topology
