// nvidia-smi topo parsing and NVLink domains on fixtures of real platform layouts.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "smi_text.hpp"
#include "topology/domains.hpp"
#include "topology/nvidia_smi_topo.hpp"

using namespace muon;
using namespace muon::topology;

namespace {

using muon::testing::expect_topo_error_mentions;
using muon::testing::topology_fixture;

std::vector<std::vector<int>> domain_gpus(const std::vector<Domain>& ds) {
  std::vector<std::vector<int>> out;
  for (const auto& d : ds) out.push_back(d.gpus);
  return out;
}

}  // namespace

TEST(NvidiaSmiTopo, HgxH100IsOneNvswitchDomain) {
  auto m = parse_nvidia_smi_topo(topology_fixture("hgx_h100.txt"), "node0");
  ASSERT_EQ(m.gpus.size(), 8u);
  ASSERT_EQ(m.nics.size(), 8u);
  EXPECT_EQ(m.gpus[5].nvlink_peers.size(), 7u);
  EXPECT_EQ(m.gpus[5].nvlink_peers.at(0), 18);
  EXPECT_TRUE(m.gpus[0].nvswitch);
  EXPECT_EQ(m.gpus[3].numa_node, 0);
  EXPECT_EQ(m.gpus[4].numa_node, 1);
  EXPECT_EQ(m.nics[2].device, "mlx5_2");
  EXPECT_EQ(m.nics[2].gpu_link.at(2), "PIX");
  EXPECT_EQ(m.nics[2].gpu_link.at(6), "SYS");
  auto d = find_domains(m);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, DomainKind::nvswitch);
  EXPECT_EQ(d[0].gpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(NvidiaSmiTopo, DgxA100WithoutGpuNumaIdColumn) {
  auto m = parse_nvidia_smi_topo(topology_fixture("dgx_a100.txt"));
  ASSERT_EQ(m.gpus.size(), 8u);
  EXPECT_EQ(m.gpus[0].nvlink_peers.at(7), 12);
  EXPECT_TRUE(m.gpus[7].nvswitch);
  EXPECT_EQ(m.gpus[0].numa_node, 3);
  EXPECT_EQ(m.gpus[6].numa_node, 5);
  auto d = find_domains(m);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, DomainKind::nvswitch);
}

TEST(NvidiaSmiTopo, NvlinkBridgedPairsAreTwoDomains) {
  auto m = parse_nvidia_smi_topo(topology_fixture("pcie_nvlink_pairs.txt"));
  ASSERT_EQ(m.gpus.size(), 4u);
  EXPECT_FALSE(m.gpus[0].nvswitch);
  EXPECT_EQ(m.gpus[0].nvlink_peers, (std::map<int, int>{{1, 4}}));
  auto d = find_domains(m);
  EXPECT_EQ(domain_gpus(d), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(d[0].kind, DomainKind::nvlink);
}

TEST(NvidiaSmiTopo, PcieOnlyFallsBackToOneDomainPerNumaNode) {
  auto m = parse_nvidia_smi_topo(topology_fixture("pcie_2socket.txt"));
  ASSERT_EQ(m.gpus.size(), 4u);
  for (const auto& g : m.gpus) EXPECT_TRUE(g.nvlink_peers.empty());
  auto d = find_domains(m);
  EXPECT_EQ(domain_gpus(d), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(d[0].kind, DomainKind::pcie);
  EXPECT_EQ(d[1].label, "numa1");
}

TEST(NvidiaSmiTopo, PastedDumpWithIndentGluedCellsAndEmptyAffinity) {
  // As pasted from collect_env: indented lines, "SYSPXB" where nvidia-smi lost a tab, an empty
  // CPU affinity cell on GPU3.
  auto m = parse_nvidia_smi_topo(topology_fixture("hgx_h100_glued.txt"));
  ASSERT_EQ(m.gpus.size(), 8u);
  EXPECT_EQ(m.gpus[3].numa_node, 0);
  EXPECT_EQ(m.gpus[5].numa_node, 1);
  EXPECT_EQ(m.nics[1].gpu_link.at(5), "PXB");
  EXPECT_EQ(find_domains(m).size(), 1u);
}

TEST(NvidiaSmiTopo, MalformedInputNamesTheLineAndField) {
  expect_topo_error_mentions("hello\nworld\n", "no header line");
  const std::string good =
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNV4\t0-7\t0\n"
      "GPU1\tNV4\t X \t0-7\t0\n";
  EXPECT_EQ(parse_nvidia_smi_topo(good).gpus.size(), 2u);
  expect_topo_error_mentions(
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNVX\t0-7\t0\n"
      "GPU1\tNV4\t X \t0-7\t0\n",
      "line 2: GPU0: unknown link token 'NVX'");
  expect_topo_error_mentions(
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNV4\t0-7\t0\n"
      "GPU1\tNV8\t X \t0-7\t0\n",
      "reverse entry differs");
  expect_topo_error_mentions(
      "\tGPU0\tGPU1\tGPU2\n"
      "GPU0\t X \tNV4\n",
      "2 link cells for 3 columns");
  expect_topo_error_mentions(
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tSYS\t0-7\t0\n",
      "column GPU1 has no row");
}

TEST(Domains, Nvl72FabricCliquesSpanHosts) {
  // GB200 NVL72: 18 hosts x 4 GPUs, one fabric clique for all 72; a second rack is another clique.
  Machine m;
  for (int rack = 0; rack < 2; ++rack) {
    for (int h = 0; h < 18; ++h) {
      for (int i = 0; i < 4; ++i) {
        Gpu g;
        g.index = i;
        g.host = "rack" + std::to_string(rack) + "-node" + std::to_string(h);
        g.fabric_cluster = "cluster-uuid-" + std::to_string(rack);
        g.fabric_clique = 1;
        for (int p = 0; p < 4; ++p) {
          if (p != i) g.nvlink_peers[p] = 18;
        }
        m.gpus.push_back(g);
      }
    }
  }
  auto d = find_domains(m);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, DomainKind::fabric);
  EXPECT_EQ(d[0].gpus.size(), 72u);
  EXPECT_EQ(d[1].gpus.front(), 72);
}

TEST(Domains, HybridCubeMeshIsCutIntoCliques) {
  // DGX-1 (V100) hybrid cube mesh: 0-3 and 4-7 fully linked, plus i <-> i+4. Not all-to-all.
  Machine m;
  for (int i = 0; i < 8; ++i) {
    Gpu g;
    g.index = i;
    g.numa_node = i / 4;
    for (int j = 0; j < 8; ++j) {
      if (j != i && (j / 4 == i / 4 || j == (i + 4) % 8)) g.nvlink_peers[j] = 1;
    }
    m.gpus.push_back(g);
  }
  auto d = find_domains(m);
  EXPECT_EQ(domain_gpus(d), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(d[0].kind, DomainKind::nvlink);
}
