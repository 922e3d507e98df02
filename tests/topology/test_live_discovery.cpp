// Live discovery through the fake NVML (tests/topology/fake_nvml.c), loaded with dlopen exactly
// as the real libnvidia-ml.so.1 would be: per-platform machines and domains, the fallbacks of an
// old driver, and clear errors when NVML is missing or fails.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "topology/domains.hpp"
#include "topology/live_discovery.hpp"
#include "topology/nvml_library.hpp"
#include "topology/topology_source.hpp"

using namespace muon;
using namespace muon::topology;

namespace {

// Sets an environment variable for one test and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

Machine discover(const char* platform, const char* library = MUON_FAKE_NVML,
                 const std::string& sysfs = "/nonexistent-sysfs") {
  ScopedEnv env("MUON_FAKE_NVML_PLATFORM", platform);
  DiscoveryOptions options;
  options.nvml_library = library;
  options.sysfs_root = sysfs;
  options.host = "testhost";
  return discover_machine(options);
}

template <typename Fn>
void expect_unavailable(Fn fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected BackendUnavailable mentioning: " << needle;
  } catch (const BackendUnavailable& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(LiveDiscovery, HgxH100IsOneNvswitchDomain) {
  const Machine m = discover("hgx_h100");
  ASSERT_EQ(m.gpus.size(), 8u);
  EXPECT_EQ(m.gpus[0].pci_bus_id, "0000:18:00.0");  // NVML's "00000000:18:00.0", normalized
  EXPECT_EQ(m.gpus[5].pci_bus_id, "0000:ab:00.0");
  EXPECT_EQ(m.gpus[3].numa_node, 0);
  EXPECT_EQ(m.gpus[4].numa_node, 1);
  EXPECT_EQ(m.gpus[2].host, "testhost");
  for (const auto& g : m.gpus) {
    EXPECT_TRUE(g.nvswitch);
    EXPECT_EQ(g.nvlink_peers.size(), 7u);
    EXPECT_TRUE(g.fabric_cluster.empty());
  }
  EXPECT_EQ(m.gpus[6].nvlink_peers.at(1), 18);
  // The device name and memory, which the planner takes the GPU model from.
  EXPECT_EQ(m.gpus[7].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(m.gpus[7].memory_bytes, 85520809984);
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, DomainKind::nvswitch);
  EXPECT_EQ(d[0].gpus.size(), 8u);
}

TEST(LiveDiscovery, Nvl72TraysJoinOneFabricDomainAcrossHosts) {
  const Machine tray = discover("nvl72_node");
  ASSERT_EQ(tray.gpus.size(), 4u);
  EXPECT_EQ(tray.gpus[2].pci_bus_id, "0018:01:00.0");
  EXPECT_EQ(tray.gpus[2].fabric_cluster, "00112233-4455-6677-8899-aabbccddeeff");
  EXPECT_EQ(tray.gpus[2].fabric_clique, 7);
  EXPECT_TRUE(tray.gpus[2].nvswitch);

  // One tray discovered, the rack of 18 trays planned: one 72-GPU fabric domain.
  const Machine rack = job_machine(tray, 18);
  const auto d = find_domains(rack);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, DomainKind::fabric);
  EXPECT_EQ(d[0].gpus.size(), 72u);

  // Trays of another clique (another NVL72 partition) stay apart.
  Machine two = tray;
  Machine other;
  {
    ScopedEnv clique("MUON_FAKE_NVML_CLIQUE", "9");
    other = discover("nvl72_node");
  }
  for (auto& g : other.gpus) {
    g.host = "othertray";
    two.gpus.push_back(g);
  }
  const auto d2 = find_domains(two);
  ASSERT_EQ(d2.size(), 2u);
  EXPECT_EQ(d2[1].gpus, (std::vector<int>{4, 5, 6, 7}));
}

TEST(LiveDiscovery, NvlinkBridgedPairs) {
  const Machine m = discover("pcie_pairs");
  ASSERT_EQ(m.gpus.size(), 4u);
  EXPECT_EQ(m.gpus[0].nvlink_peers, (std::map<int, int>{{1, 4}}));
  EXPECT_EQ(m.gpus[3].nvlink_peers, (std::map<int, int>{{2, 4}}));
  EXPECT_FALSE(m.gpus[0].nvswitch);
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, DomainKind::nvlink);
  EXPECT_EQ(d[1].gpus, (std::vector<int>{2, 3}));
}

TEST(LiveDiscovery, PcieOnlyTakesNumaFromSysfs) {
  const auto root =
      std::filesystem::temp_directory_path() / ("muon-sysfs-" + std::to_string(::getpid()));
  for (auto [bdf, node] : {std::pair{"0000:41:00.0", "0"}, std::pair{"0000:c1:00.0", "1"}}) {
    const auto dir = root / "bus/pci/devices" / bdf;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "numa_node") << node << "\n";
  }
  const Machine m = discover("pcie", MUON_FAKE_NVML, root.string());
  std::filesystem::remove_all(root);
  ASSERT_EQ(m.gpus.size(), 2u);
  EXPECT_EQ(m.gpus[0].numa_node, 0);
  EXPECT_EQ(m.gpus[1].numa_node, 1);
  EXPECT_TRUE(m.gpus[0].nvlink_peers.empty());
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].kind, DomainKind::pcie);
  EXPECT_EQ(d[1].label, "testhost:numa1");
}

TEST(LiveDiscovery, OldDriverWithoutOptionalEntryPoints) {
  // No remote device type: a far end that is not a local GPU counts as a switch.
  const Machine hgx = discover("hgx_h100", MUON_FAKE_NVML_MINIMAL);
  ASSERT_EQ(hgx.gpus.size(), 8u);
  EXPECT_TRUE(hgx.gpus[0].nvswitch);
  EXPECT_EQ(hgx.gpus[0].nvlink_peers.at(7), 18);
  EXPECT_EQ(hgx.gpus[0].numa_node, -1);  // no nvmlDeviceGetNumaNodeId, no sysfs entry
  const Machine pairs = discover("pcie_pairs", MUON_FAKE_NVML_MINIMAL);
  EXPECT_EQ(pairs.gpus[1].nvlink_peers, (std::map<int, int>{{0, 4}}));
  EXPECT_FALSE(pairs.gpus[1].nvswitch);
  const Machine tray = discover("nvl72_node", MUON_FAKE_NVML_MINIMAL);
  EXPECT_TRUE(tray.gpus[0].fabric_cluster.empty());  // no fabric entry points
  EXPECT_TRUE(hgx.gpus[0].model.empty());            // no name or memory either
  EXPECT_EQ(hgx.gpus[0].memory_bytes, 0);
}

TEST(LiveDiscovery, ShutsNvmlDownAfterDiscovery) {
  // Keep the fake loaded across the discovery, so its counters survive the wrapper's dlclose.
  void* handle = dlopen(MUON_FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto open_inits = reinterpret_cast<int (*)()>(dlsym(handle, "fake_nvml_open_inits"));
  ASSERT_NE(open_inits, nullptr);
  EXPECT_EQ(discover("hgx_h100").gpus.size(), 8u);
  EXPECT_EQ(open_inits(), 0);
  dlclose(handle);
}

TEST(LiveDiscovery, LibraryPathFromEnvironment) {
  {
    ScopedEnv lib("MUON_NVML_LIBRARY", nullptr);
    EXPECT_EQ(nvml_library_path(), "libnvidia-ml.so.1");
  }
  ScopedEnv lib("MUON_NVML_LIBRARY", MUON_FAKE_NVML);
  ScopedEnv platform("MUON_FAKE_NVML_PLATFORM", "pcie_pairs");
  EXPECT_EQ(nvml_library_path(), MUON_FAKE_NVML);
  const LoadedTopology t = load_topology("auto");
  EXPECT_EQ(t.machine.gpus.size(), 4u);
  EXPECT_EQ(t.source.rfind("live discovery (NVML) on ", 0), 0u) << t.source;
}

TEST(LiveDiscovery, NoNvmlIsAClearErrorNeverACrash) {
  expect_unavailable([] { discover("hgx_h100", "/nonexistent/libnvidia-ml.so.1"); },
                     "NVML not available: cannot load '/nonexistent/libnvidia-ml.so.1'");
  expect_unavailable([] { discover("hgx_h100", "/nonexistent/libnvidia-ml.so.1"); },
                     "MUON_NVML_LIBRARY");
  expect_unavailable([] { discover("hgx_h100", "libm.so.6"); },
                     "lacks the entry point nvmlInit_v2");
  expect_unavailable([] { discover("no_driver"); },
                     "nvmlInit_v2 failed in '" MUON_FAKE_NVML "': Driver Not Loaded");
  expect_unavailable([] { discover("no_driver", MUON_FAKE_NVML_MINIMAL); }, "NVML error 9");
  expect_unavailable([] { discover(nullptr); }, "Driver Not Loaded");
}

TEST(LiveDiscovery, NormalizesPciBusIds) {
  EXPECT_EQ(normalize_pci_bus_id("00000000:1A:00.0"), "0000:1a:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000019:01:00.0"), "0019:01:00.0");
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("000100AB:01:00.0"), "100ab:01:00.0");
}
