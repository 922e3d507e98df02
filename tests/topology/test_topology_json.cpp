// JSON topology descriptions (muon-offload-topology/1): round trips, the GB200 NVL72 and
// multi-node HGX fixtures, source detection, the job's machine, and errors that name the field.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "topology/domains.hpp"
#include "topology/nvidia_smi_topo.hpp"
#include "topology/topology_json.hpp"
#include "topology/topology_source.hpp"

using namespace muon;
using namespace muon::topology;

namespace {

std::string read_fixture(const std::string& name) {
  std::ifstream f(std::string(MUON_TOPOLOGY_FIXTURES) + "/" + name);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Parses `text` and expects an InvalidArgument whose message contains `needle`.
void expect_json_error(const std::string& text, const std::string& needle) {
  try {
    parse_topology_json(text, "t.json");
    FAIL() << "expected an error mentioning: " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A one-host document with `gpus` as the GPU array's text.
std::string doc_with_gpus(const std::string& gpus) {
  return R"({"schema": "muon-offload-topology/1", "hosts": [{"name": "h", "gpus": [)" + gpus +
         "]}]}";
}

}  // namespace

TEST(TopologyJson, RoundTripsAnNvidiaSmiMachine) {
  const Machine m = parse_nvidia_smi_topo(read_fixture("hgx_h100.txt"), "node0");
  const std::string text = write_topology_json(m);
  EXPECT_NE(text.find("\"schema\": \"muon-offload-topology/1\""), std::string::npos);
  const Machine back = parse_topology_json(text);
  EXPECT_EQ(back, m);
  EXPECT_EQ(write_topology_json(back), text);
}

TEST(TopologyJson, Gb200Nvl72RackIsOneFabricDomainOver18Hosts) {
  const Machine m = parse_topology_json(read_fixture("gb200_nvl72.json"));
  ASSERT_EQ(m.gpus.size(), 72u);
  EXPECT_EQ(host_names(m).size(), 18u);
  EXPECT_EQ(m.gpus[5].host, "nvl72-tray01");
  EXPECT_EQ(m.gpus[5].index, 1);
  EXPECT_EQ(m.gpus[5].pci_bus_id, "0009:01:00.0");
  EXPECT_EQ(m.gpus[5].fabric_clique, 1);
  EXPECT_EQ(m.gpus[5].nvlink_peers.at(3), 18);
  EXPECT_EQ(m.nics.size(), 72u);
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, DomainKind::fabric);
  EXPECT_EQ(d[0].gpus.size(), 72u);
}

TEST(TopologyJson, MultiNodeHgxIsOneNvswitchDomainPerHost) {
  const Machine m = parse_topology_json(read_fixture("hgx_h100_2node.json"));
  ASSERT_EQ(m.gpus.size(), 16u);
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, DomainKind::nvswitch);
  EXPECT_EQ(d[0].gpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(d[1].gpus.front(), 8);
  EXPECT_EQ(m.gpus[12].host, "hgx-b");
  EXPECT_EQ(m.gpus[12].numa_node, 1);
  EXPECT_EQ(m.nics[9].host, "hgx-b");
  EXPECT_EQ(m.nics[9].gpu_link.at(1), "PIX");
}

TEST(TopologyJson, MalformedInputNamesTheLineOrField) {
  expect_json_error("{\n  \"schema\": \"muon-offload-topology/1\",\n  \"hosts\": [,]\n}",
                    "t.json, line 3, column 13: JSON syntax error");
  expect_json_error("[1, 2]", "t.json: expected a JSON object at the top level, got array");
  expect_json_error(R"({"schema": "muon-offload-topology/2", "hosts": []})",
                    "t.json: schema: 'muon-offload-topology/2' is not supported");
  expect_json_error(R"({"hosts": []})", "t.json: schema: missing field");
  expect_json_error(R"({"schema": "muon-offload-topology/1", "hosts": []})",
                    "hosts: must list at least one host");
  expect_json_error(doc_with_gpus(R"({"index": 0}, {"numa_node": 0})"),
                    "t.json: hosts[0].gpus[1].index: missing field");
  expect_json_error(doc_with_gpus(R"({"index": 0, "numa_node": "0"})"),
                    "hosts[0].gpus[0].numa_node: expected an integer, got string");
  expect_json_error(doc_with_gpus(R"({"index": -1})"),
                    "hosts[0].gpus[0].index: -1 is out of range [0, 4095]");
  expect_json_error(doc_with_gpus(R"({"index": 0, "nvlinks": []})"),
                    "hosts[0].gpus[0].nvlinks: unknown field (known here: index, pci_bus_id");
  expect_json_error(doc_with_gpus(R"({"index": 0}, {"index": 0})"),
                    "hosts[0].gpus[1].index: 0 is used by another GPU of this host");
  expect_json_error(doc_with_gpus(R"({"index": 0, "pci_bus_id": "18:00.0"})"),
                    "hosts[0].gpus[0].pci_bus_id: '18:00.0' is not a PCI bus id");
  expect_json_error(
      doc_with_gpus(R"({"index": 0, "nvlink": [{"peer": 1, "links": 4}]},
                                     {"index": 1, "nvlink": [{"peer": 0, "links": 2}]})"),
      "hosts[0].gpus[0].nvlink: GPU0 -> GPU1 has 4 links but the reverse entry differs");
  expect_json_error(doc_with_gpus(R"({"index": 0, "nvlink": [{"peer": 5, "links": 4}]})"),
                    "hosts[0].gpus[0].nvlink: peer GPU5 is not a GPU of host 'h'");
  expect_json_error(doc_with_gpus(R"({"index": 0, "nvlink": [{"peer": 0, "links": 4}]})"),
                    "hosts[0].gpus[0].nvlink[0].peer: a GPU cannot be its own NVLink peer");
  expect_json_error(doc_with_gpus(R"({"index": 0, "nvlink": [{"peer": 1, "links": 0}]})"),
                    "hosts[0].gpus[0].nvlink[0].links: 0 is out of range [1, 1024]");
  expect_json_error(doc_with_gpus(R"({"index": 0, "fabric": {"cluster": "", "clique": 1}})"),
                    "hosts[0].gpus[0].fabric.cluster: must not be empty");
  expect_json_error(R"({"schema": "muon-offload-topology/1", "hosts": [
      {"name": "a", "gpus": [{"index": 0}]}, {"name": "a", "gpus": []}]})",
                    "hosts[1].name: 'a' is listed twice");
  expect_json_error(R"({"schema": "muon-offload-topology/1", "hosts": [{"name": "a",
      "gpus": [{"index": 0}], "nics": [{"name": "NIC0", "gpu_link": {"0": "PCIE"}}]}]})",
                    "hosts[0].nics[0].gpu_link.0: link class 'PCIE' is not one of PIX");
  expect_json_error(R"({"schema": "muon-offload-topology/1", "hosts": [{"name": "a",
      "gpus": [{"index": 0}], "nics": [{"name": "NIC0", "gpu_link": {"3": "PIX"}}]}]})",
                    "hosts[0].nics[0].gpu_link: GPU3 is not a GPU of host 'a'");
}

TEST(TopologySource, DetectsJsonOrNvidiaSmiTextByContent) {
  const auto json = parse_topology_text("  \n" + read_fixture("hgx_h100_2node.json"), "x.json");
  EXPECT_EQ(json.machine.gpus.size(), 16u);
  EXPECT_EQ(json.source, "JSON description x.json");
  const auto text = parse_topology_text(read_fixture("dgx_a100.txt"), "dgx.txt");
  EXPECT_EQ(text.machine.gpus.size(), 8u);
  EXPECT_EQ(text.source, "nvidia-smi topo text dgx.txt");
  try {
    parse_topology_text("\tGPU0\tGPU1\nGPU0\t X \tNVX\n", "bad.txt");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt: nvidia-smi topo text, line 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_topology("/nonexistent/topo.json"), InvalidArgument);
}

TEST(TopologySource, JobMachineReplicatesOneHostOrKeepsTheFirstHosts) {
  const Machine hgx = parse_nvidia_smi_topo(read_fixture("hgx_h100.txt"));
  const Machine one = job_machine(hgx, 0);
  EXPECT_EQ(host_names(one), (std::vector<std::string>{"node0"}));
  const Machine four = job_machine(hgx, 4);
  ASSERT_EQ(four.gpus.size(), 32u);
  EXPECT_EQ(host_names(four), (std::vector<std::string>{"node0", "node1", "node2", "node3"}));
  EXPECT_EQ(four.nics.size(), 32u);
  EXPECT_EQ(find_domains(four).size(), 4u);

  const Machine rack = parse_topology_json(read_fixture("gb200_nvl72.json"));
  const Machine half = job_machine(rack, 9);
  EXPECT_EQ(half.gpus.size(), 36u);
  EXPECT_EQ(find_domains(half).size(), 1u);
  EXPECT_THROW(job_machine(rack, 19), InvalidArgument);
  EXPECT_THROW(job_machine(Machine{}, 1), InvalidArgument);
}
