#include "topology/nvml_library.hpp"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

// Every NVML call: on failure a DeviceError naming the call, NVML's error string and file:line.
#define MUON_NVML_CHECK(call)                                                                    \
  do {                                                                                           \
    const nvmlReturn_t muon_nvml_rc_ = (call);                                                   \
    if (muon_nvml_rc_ != NVML_SUCCESS) {                                                         \
      throw ::muon::DeviceError(std::string("NVML call ") + #call +                              \
                                " failed: " + error_string(muon_nvml_rc_) + " (" + path_ + ")"); \
    }                                                                                            \
  } while (0)

namespace muon::topology {

std::string nvml_library_path() {
  const char* env = std::getenv("MUON_NVML_LIBRARY");
  return env && *env ? std::string(env) : std::string("libnvidia-ml.so.1");
}

std::string normalize_pci_bus_id(std::string_view bus_id) {
  std::string s(bus_id);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const auto colon = s.find(':');
  if (colon != std::string::npos && colon > 4) {
    // NVML pads the domain to 8 digits; sysfs and nvidia-smi topo use 4.
    const std::string domain = s.substr(0, colon);
    const auto nonzero = domain.find_first_not_of('0');
    std::string trimmed = nonzero == std::string::npos ? "" : domain.substr(nonzero);
    if (trimmed.size() < 4) trimmed = std::string(4 - trimmed.size(), '0') + trimmed;
    s = trimmed + s.substr(colon);
  }
  return s;
}

namespace {

template <typename Fn>
Fn symbol(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

}  // namespace

NvmlLibrary::NvmlLibrary(std::string path) : path_(path.empty() ? nvml_library_path() : path) {
  handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    throw BackendUnavailable("NVML not available: cannot load '" + path_ + "' (" +
                             (why ? why : "unknown dlopen error") +
                             "); is the NVIDIA driver installed? Set MUON_NVML_LIBRARY to the "
                             "library's path, or describe the machine with a JSON file or the "
                             "text of `nvidia-smi topo -m` instead of `auto`");
  }
  init_ = symbol<nvmlInit_v2_fn>(handle_, "nvmlInit_v2");
  shutdown_ = symbol<nvmlShutdown_fn>(handle_, "nvmlShutdown");
  get_count_ = symbol<nvmlDeviceGetCount_v2_fn>(handle_, "nvmlDeviceGetCount_v2");
  get_handle_ = symbol<nvmlDeviceGetHandleByIndex_v2_fn>(handle_, "nvmlDeviceGetHandleByIndex_v2");
  get_pci_ = symbol<nvmlDeviceGetPciInfo_v3_fn>(handle_, "nvmlDeviceGetPciInfo_v3");
  get_link_state_ = symbol<nvmlDeviceGetNvLinkState_fn>(handle_, "nvmlDeviceGetNvLinkState");
  get_remote_pci_ = symbol<nvmlDeviceGetNvLinkRemotePciInfo_v2_fn>(
      handle_, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  const std::pair<const char*, bool> required[] = {
      {"nvmlInit_v2", init_ != nullptr},
      {"nvmlShutdown", shutdown_ != nullptr},
      {"nvmlDeviceGetCount_v2", get_count_ != nullptr},
      {"nvmlDeviceGetHandleByIndex_v2", get_handle_ != nullptr},
      {"nvmlDeviceGetPciInfo_v3", get_pci_ != nullptr},
      {"nvmlDeviceGetNvLinkState", get_link_state_ != nullptr},
      {"nvmlDeviceGetNvLinkRemotePciInfo_v2", get_remote_pci_ != nullptr},
  };
  for (const auto& [name, found] : required) {
    if (!found) {
      dlclose(handle_);
      handle_ = nullptr;
      throw BackendUnavailable("NVML library '" + path_ + "' lacks the entry point " + name +
                               " (driver too old, or not NVML)");
    }
  }
  // Optional entry points: older drivers, or GPUs without fabric support.
  error_string_ = symbol<nvmlErrorString_fn>(handle_, "nvmlErrorString");
  get_remote_type_ = symbol<nvmlDeviceGetNvLinkRemoteDeviceType_fn>(
      handle_, "nvmlDeviceGetNvLinkRemoteDeviceType");
  get_fabric_ = symbol<nvmlDeviceGetGpuFabricInfo_fn>(handle_, "nvmlDeviceGetGpuFabricInfo");
  get_fabric_v_ = symbol<nvmlDeviceGetGpuFabricInfoV_fn>(handle_, "nvmlDeviceGetGpuFabricInfoV");
  get_numa_ = symbol<nvmlDeviceGetNumaNodeId_fn>(handle_, "nvmlDeviceGetNumaNodeId");
  get_name_ = symbol<nvmlDeviceGetName_fn>(handle_, "nvmlDeviceGetName");
  get_memory_ = symbol<nvmlDeviceGetMemoryInfo_fn>(handle_, "nvmlDeviceGetMemoryInfo");

  const nvmlReturn_t rc = init_();
  if (rc != NVML_SUCCESS) {
    const std::string why = error_string(rc);
    dlclose(handle_);
    handle_ = nullptr;
    throw BackendUnavailable("NVML not available: nvmlInit_v2 failed in '" + path_ + "': " + why);
  }
  initialized_ = true;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_) shutdown_();
  if (handle_) dlclose(handle_);
}

std::string NvmlLibrary::error_string(nvmlReturn_t rc) const {
  if (error_string_) {
    if (const char* s = error_string_(rc)) return s;
  }
  return "NVML error " + std::to_string(static_cast<int>(rc));
}

unsigned NvmlLibrary::device_count() const {
  unsigned n = 0;
  MUON_NVML_CHECK(get_count_(&n));
  return n;
}

nvmlDevice_t NvmlLibrary::device(unsigned index) const {
  nvmlDevice_t d = nullptr;
  MUON_NVML_CHECK(get_handle_(index, &d));
  return d;
}

std::string NvmlLibrary::pci_bus_id(nvmlDevice_t device) const {
  nvmlPciInfo_t pci;
  std::memset(&pci, 0, sizeof pci);
  MUON_NVML_CHECK(get_pci_(device, &pci));
  pci.busId[sizeof pci.busId - 1] = '\0';
  return normalize_pci_bus_id(pci.busId);
}

bool NvmlLibrary::nvlink_active(nvmlDevice_t device, unsigned link) const {
  nvmlEnableState_t state = NVML_FEATURE_DISABLED;
  const nvmlReturn_t rc = get_link_state_(device, link, &state);
  if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_INVALID_ARGUMENT) return false;
  MUON_NVML_CHECK(rc);
  return state == NVML_FEATURE_ENABLED;
}

std::string NvmlLibrary::nvlink_remote_bus_id(nvmlDevice_t device, unsigned link) const {
  nvmlPciInfo_t pci;
  std::memset(&pci, 0, sizeof pci);
  MUON_NVML_CHECK(get_remote_pci_(device, link, &pci));
  pci.busId[sizeof pci.busId - 1] = '\0';
  return normalize_pci_bus_id(pci.busId);
}

std::optional<nvmlIntNvLinkDeviceType_t> NvmlLibrary::nvlink_remote_type(nvmlDevice_t device,
                                                                         unsigned link) const {
  if (!get_remote_type_) return std::nullopt;
  nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
  const nvmlReturn_t rc = get_remote_type_(device, link, &type);
  if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_FUNCTION_NOT_FOUND) return std::nullopt;
  MUON_NVML_CHECK(rc);
  return type;
}

std::optional<FabricInfo> NvmlLibrary::fabric_info(nvmlDevice_t device) const {
  unsigned char uuid[NVML_GPU_FABRIC_UUID_LEN] = {};
  unsigned clique = 0;
  nvmlReturn_t status = NVML_SUCCESS;
  nvmlGpuFabricState_t state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
  nvmlReturn_t rc = NVML_ERROR_FUNCTION_NOT_FOUND;
  if (get_fabric_v_) {
    nvmlGpuFabricInfoV_t info;
    std::memset(&info, 0, sizeof info);
    info.version = nvmlGpuFabricInfo_v2;
    rc = get_fabric_v_(device, &info);
    if (rc == NVML_SUCCESS) {
      std::memcpy(uuid, info.clusterUuid, sizeof uuid);
      clique = info.cliqueId;
      status = info.status;
      state = info.state;
    }
  }
  if (rc != NVML_SUCCESS && get_fabric_) {
    nvmlGpuFabricInfo_t info;
    std::memset(&info, 0, sizeof info);
    rc = get_fabric_(device, &info);
    if (rc == NVML_SUCCESS) {
      std::memcpy(uuid, info.clusterUuid, sizeof uuid);
      clique = info.cliqueId;
      status = info.status;
      state = info.state;
    }
  }
  if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_FUNCTION_NOT_FOUND ||
      rc == NVML_ERROR_INVALID_ARGUMENT) {
    return std::nullopt;
  }
  MUON_NVML_CHECK(rc);
  if (state != NVML_GPU_FABRIC_STATE_COMPLETED || status != NVML_SUCCESS) return std::nullopt;
  bool zero = true;
  for (unsigned char b : uuid) zero = zero && b == 0;
  if (zero) return std::nullopt;
  char text[37];
  std::snprintf(text, sizeof text,
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0],
                uuid[1], uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9],
                uuid[10], uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);
  return FabricInfo{text, static_cast<int>(clique)};
}

std::optional<std::string> NvmlLibrary::device_name(nvmlDevice_t device) const {
  if (!get_name_) return std::nullopt;
  char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
  if (get_name_(device, name, sizeof name) != NVML_SUCCESS) return std::nullopt;
  name[sizeof name - 1] = '\0';
  return std::string(name);
}

std::optional<int64_t> NvmlLibrary::memory_total(nvmlDevice_t device) const {
  if (!get_memory_) return std::nullopt;
  nvmlMemory_t memory{};
  if (get_memory_(device, &memory) != NVML_SUCCESS || memory.total == 0) return std::nullopt;
  return static_cast<int64_t>(memory.total);
}

std::optional<int> NvmlLibrary::numa_node(nvmlDevice_t device) const {
  if (!get_numa_) return std::nullopt;
  unsigned node = 0;
  const nvmlReturn_t rc = get_numa_(device, &node);
  if (rc != NVML_SUCCESS) return std::nullopt;
  return static_cast<int>(node);
}

}  // namespace muon::topology
