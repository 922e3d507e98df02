// The GPU models the planner knows (published dense peaks) and how a job's model is found: a
// flag, the device names of the topology (JSON "model", NVML), the links, or an assumption.
#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "plan/gpu_model.hpp"
#include "topology/topology_json.hpp"

using namespace muon;
using namespace muon::plan;

namespace {

topology::Machine nvswitch_node(int links, const std::string& model = "", int64_t memory = 0) {
  topology::Machine m;
  for (int i = 0; i < 8; ++i) {
    topology::Gpu g;
    g.index = i;
    g.host = "node0";
    g.nvswitch = true;
    for (int p = 0; p < 8; ++p) {
      if (p != i) g.nvlink_peers[p] = links;
    }
    g.model = model;
    g.memory_bytes = memory;
    m.gpus.push_back(g);
  }
  return m;
}

}  // namespace

TEST(GpuModel, PublishedDensePeaks) {
  // Dense = half the "with sparsity" tensor-core figure of the datasheets.
  EXPECT_DOUBLE_EQ(find_gpu_model("a100").bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(find_gpu_model("a100").fp32_flops, 19.5e12);
  EXPECT_DOUBLE_EQ(find_gpu_model("h100").bf16_flops, 989e12);
  EXPECT_DOUBLE_EQ(find_gpu_model("H100-SXM").fp32_flops, 67e12);
  EXPECT_DOUBLE_EQ(find_gpu_model("h200").memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(find_gpu_model("b200").bf16_flops, 2250e12);
  EXPECT_DOUBLE_EQ(find_gpu_model("gb200").bf16_flops, 2500e12);
  EXPECT_DOUBLE_EQ(find_gpu_model("gb200").memory_bytes, 186e9);
  try {
    find_gpu_model("v100");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("known: a100, h100"), std::string::npos) << e.what();
  }
}

TEST(GpuModel, DeviceNamesAsNvmlPrintsThem) {
  EXPECT_EQ(gpu_model_for_name("NVIDIA A100-SXM4-80GB")->key, "a100");
  EXPECT_EQ(gpu_model_for_name("NVIDIA H100 80GB HBM3")->key, "h100");
  EXPECT_EQ(gpu_model_for_name("NVIDIA H100 PCIe")->key, "h100_pcie");
  EXPECT_EQ(gpu_model_for_name("NVIDIA H200")->key, "h200");
  EXPECT_EQ(gpu_model_for_name("NVIDIA B200")->key, "b200");
  EXPECT_EQ(gpu_model_for_name("NVIDIA GB200")->key, "gb200");
  EXPECT_EQ(gpu_model_for_name("NVIDIA GeForce RTX 4090"), nullptr);
}

TEST(GpuModel, IdentifiedByFlagThenNamesThenLinksElseAssumed) {
  auto id = identify_gpus(nvswitch_node(12), "");
  EXPECT_EQ(id.model.key, "a100");
  EXPECT_EQ(id.source, GpuModelSource::links);
  id = identify_gpus(nvswitch_node(18), "");
  EXPECT_EQ(id.model.key, "h100");
  EXPECT_EQ(id.source, GpuModelSource::links);
  // The topology's name beats the links; its memory size beats the model's.
  id = identify_gpus(nvswitch_node(12, "NVIDIA A100-SXM4-40GB", 42'505'273'344), "");
  EXPECT_EQ(id.model.key, "a100");
  EXPECT_EQ(id.source, GpuModelSource::topology);
  EXPECT_DOUBLE_EQ(id.model.memory_bytes, 42'505'273'344.0);
  EXPECT_NE(id.how.find("A100-SXM4-40GB"), std::string::npos);
  // A flag beats everything.
  id = identify_gpus(nvswitch_node(18, "NVIDIA H100 80GB HBM3"), "h200");
  EXPECT_EQ(id.model.key, "h200");
  EXPECT_EQ(id.source, GpuModelSource::flag);
  // Nothing to go by: assumed, and said so.
  topology::Machine pcie;
  pcie.gpus.resize(2);
  id = identify_gpus(pcie, "");
  EXPECT_EQ(id.source, GpuModelSource::assumed);
  EXPECT_NE(id.how.find("--gpu-model"), std::string::npos);
  // Two models in one job: plan one at a time.
  auto mixed = nvswitch_node(18, "NVIDIA H100 80GB HBM3");
  mixed.gpus[3].model = "NVIDIA H200";
  EXPECT_THROW(identify_gpus(mixed, ""), InvalidArgument);
  EXPECT_NO_THROW(identify_gpus(mixed, "h100"));
}

TEST(GpuModel, TopologyJsonCarriesTheModelAndMemory) {
  const std::string text = R"({"schema": "muon-offload-topology/1", "hosts": [{"name": "a",
      "gpus": [{"index": 0, "model": "NVIDIA H200", "memory_bytes": 150754820096}]}]})";
  const auto m = topology::parse_topology_json(text, "t.json");
  ASSERT_EQ(m.gpus.size(), 1u);
  EXPECT_EQ(m.gpus[0].model, "NVIDIA H200");
  EXPECT_EQ(m.gpus[0].memory_bytes, 150754820096);
  EXPECT_EQ(topology::parse_topology_json(topology::write_topology_json(m)), m);
  EXPECT_EQ(identify_gpus(m, "").model.key, "h200");
  EXPECT_THROW(topology::parse_topology_json(R"({"schema": "muon-offload-topology/1", "hosts":
      [{"name": "a", "gpus": [{"index": 0, "memory_bytes": 0}]}]})"),
               InvalidArgument);
}
