/* A fake NVML for the live-discovery tests: exports the entry points of topology/nvml_stub.hpp
 * and answers as one of a few platforms, chosen by $MUON_FAKE_NVML_PLATFORM when nvmlInit_v2 is
 * called:
 *   hgx_h100    8 GPUs, 18 NVLinks each to NVSwitches, NUMA 0 (GPU0-3) and 1 (GPU4-7), no fabric
 *   nvl72_node  one GB200 compute tray: 4 GPUs, 18 links each to the NVLink switch trays, fabric
 *               cluster 00112233-4455-6677-8899-aabbccddeeff, clique $MUON_FAKE_NVML_CLIQUE (7)
 *   pcie_pairs  4 GPUs, NVLink bridges GPU0<->GPU1 and GPU2<->GPU3 (4 links each), NUMA 0,0,1,1
 *   pcie        2 GPUs, no NVLink, no NUMA answer from NVML (sysfs decides)
 *   no_driver   nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED (also when unset)
 * Built twice: fake_nvml (everything) and, with FAKE_NVML_MINIMAL, fake_nvml_minimal, an old
 * driver without nvmlErrorString, nvmlDeviceGetNvLinkRemoteDeviceType, the fabric calls and
 * nvmlDeviceGetNumaNodeId, nvmlDeviceGetName and nvmlDeviceGetMemoryInfo. Loaded by the tests
 * through the same dlopen path as the real one. Device names and memory sizes are as the real
 * boards report them (H100 SXM5 80 GB, GB200, RTX A6000, L4). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology/nvml_stub.hpp"

#define FAKE_MAX_GPUS 8

struct nvmlDevice_st {
  int index;
};

typedef struct {
  const char* bus_id; /* as NVML prints it: 8-digit domain, upper case */
  int numa;           /* -1: nvmlDeviceGetNumaNodeId answers NOT_SUPPORTED */
  int links;          /* active NVLinks */
  int peer;           /* >= 0: every link goes to this GPU; -1: to a switch */
} FakeGpu;

static const FakeGpu kHgx[] = {{"00000000:18:00.0", 0, 18, -1}, {"00000000:2A:00.0", 0, 18, -1},
                               {"00000000:3A:00.0", 0, 18, -1}, {"00000000:5D:00.0", 0, 18, -1},
                               {"00000000:9A:00.0", 1, 18, -1}, {"00000000:AB:00.0", 1, 18, -1},
                               {"00000000:BA:00.0", 1, 18, -1}, {"00000000:DB:00.0", 1, 18, -1}};
static const FakeGpu kNvl72Node[] = {{"00000008:01:00.0", 0, 18, -1},
                                     {"00000009:01:00.0", 0, 18, -1},
                                     {"00000018:01:00.0", 1, 18, -1},
                                     {"00000019:01:00.0", 1, 18, -1}};
static const FakeGpu kPciePairs[] = {{"00000000:1B:00.0", 0, 4, 1},
                                     {"00000000:1C:00.0", 0, 4, 0},
                                     {"00000000:3D:00.0", 1, 4, 3},
                                     {"00000000:3E:00.0", 1, 4, 2}};
static const FakeGpu kPcie[] = {{"00000000:41:00.0", -1, 0, -1}, {"00000000:C1:00.0", -1, 0, -1}};

/* What nvmlDeviceGetName and nvmlDeviceGetMemoryInfo answer on each platform. */
static const char* g_name = NULL;
static unsigned long long g_memory = 0;

static const FakeGpu* g_gpus = NULL;
static unsigned g_count = 0;
static int g_fabric = 0;
static unsigned g_clique = 7;
static int g_initialized = 0;
static struct nvmlDevice_st g_devices[FAKE_MAX_GPUS];

static void fill_pci(const char* bus_id, nvmlPciInfo_t* pci) {
  memset(pci, 0, sizeof *pci);
  snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
  snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus_id + 4);
  pci->pciDeviceId = 0x233010de;
}

static int valid(nvmlDevice_t device) {
  return g_initialized && device && device->index >= 0 && (unsigned)device->index < g_count;
}

nvmlReturn_t nvmlInit_v2(void) {
  const char* p = getenv("MUON_FAKE_NVML_PLATFORM");
  const char* clique = getenv("MUON_FAKE_NVML_CLIQUE");
  g_fabric = 0;
  g_clique = clique ? (unsigned)atoi(clique) : 7u;
  if (!p || strcmp(p, "no_driver") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
  if (strcmp(p, "hgx_h100") == 0) {
    g_gpus = kHgx;
    g_count = 8;
    g_name = "NVIDIA H100 80GB HBM3";
    g_memory = 85520809984ull;
  } else if (strcmp(p, "nvl72_node") == 0) {
    g_gpus = kNvl72Node;
    g_count = 4;
    g_fabric = 1;
    g_name = "NVIDIA GB200";
    g_memory = 199715979264ull;
  } else if (strcmp(p, "pcie_pairs") == 0) {
    g_gpus = kPciePairs;
    g_count = 4;
    g_name = "NVIDIA RTX A6000";
    g_memory = 51527024640ull;
  } else if (strcmp(p, "pcie") == 0) {
    g_gpus = kPcie;
    g_count = 2;
    g_name = "NVIDIA L4";
    g_memory = 24152899584ull;
  } else {
    return NVML_ERROR_UNKNOWN;
  }
  for (unsigned i = 0; i < g_count; ++i) g_devices[i].index = (int)i;
  g_initialized += 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
  g_initialized -= 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
  if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
  *deviceCount = g_count;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
  if (index >= g_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &g_devices[index];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  if (!valid(device) || !pci) return NVML_ERROR_INVALID_ARGUMENT;
  fill_pci(g_gpus[device->index].bus_id, pci);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t* isActive) {
  if (!valid(device) || !isActive) return NVML_ERROR_INVALID_ARGUMENT;
  if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
  if (g_gpus[device->index].links == 0) return NVML_ERROR_NOT_SUPPORTED;
  *isActive =
      (int)link < g_gpus[device->index].links ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t* pci) {
  if (!valid(device) || !pci || (int)link >= g_gpus[device->index].links) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  const int peer = g_gpus[device->index].peer;
  if (peer >= 0) {
    fill_pci(g_gpus[peer].bus_id, pci);
  } else {
    /* Four NVSwitches on the baseboard; links spread over them. */
    char sw[32];
    snprintf(sw, sizeof sw, "00000000:%02X:00.0", 0x05 + link % 4);
    fill_pci(sw, pci);
  }
  return NVML_SUCCESS;
}

#ifndef FAKE_NVML_MINIMAL

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    default:
      return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t* type) {
  if (!valid(device) || !type || (int)link >= g_gpus[device->index].links) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *type = g_gpus[device->index].peer >= 0 ? NVML_NVLINK_DEVICE_TYPE_GPU
                                          : NVML_NVLINK_DEVICE_TYPE_SWITCH;
  return NVML_SUCCESS;
}

static void fill_fabric(unsigned char* uuid, nvmlReturn_t* status, unsigned* clique,
                        nvmlGpuFabricState_t* state) {
  static const unsigned char kUuid[NVML_GPU_FABRIC_UUID_LEN] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55,
                                                                0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb,
                                                                0xcc, 0xdd, 0xee, 0xff};
  memcpy(uuid, kUuid, sizeof kUuid);
  *status = NVML_SUCCESS;
  *clique = g_clique;
  *state = NVML_GPU_FABRIC_STATE_COMPLETED;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t* info) {
  if (!valid(device) || !info) return NVML_ERROR_INVALID_ARGUMENT;
  if (!g_fabric) return NVML_ERROR_NOT_SUPPORTED;
  fill_fabric(info->clusterUuid, &info->status, &info->cliqueId, &info->state);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t* info) {
  if (!valid(device) || !info) return NVML_ERROR_INVALID_ARGUMENT;
  if (info->version != nvmlGpuFabricInfo_v2) return NVML_ERROR_INVALID_ARGUMENT;
  if (!g_fabric) return NVML_ERROR_NOT_SUPPORTED;
  fill_fabric(info->clusterUuid, &info->status, &info->cliqueId, &info->state);
  info->healthMask = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int* node) {
  if (!valid(device) || !node) return NVML_ERROR_INVALID_ARGUMENT;
  if (g_gpus[device->index].numa < 0) return NVML_ERROR_NOT_SUPPORTED;
  *node = (unsigned)g_gpus[device->index].numa;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  if (!valid(device) || !name || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
  if ((unsigned)snprintf(name, length, "%s", g_name) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (!valid(device) || !memory) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = g_memory;
  memory->used = g_memory / 100;
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

#endif /* FAKE_NVML_MINIMAL */

/* Test hook, not NVML: how many nvmlInit_v2 calls are not yet matched by nvmlShutdown. */
int fake_nvml_open_inits(void) {
  return g_initialized;
}
