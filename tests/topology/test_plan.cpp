// Plans on every fixture: domains, offload picks, rank maps, parameter ownership, relays and
// endpoints, the auto choice, the plan JSON, and errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "plan/plan.hpp"
#include "plan/plan_json.hpp"
#include "plan/plan_table.hpp"
#include "read_text.hpp"
#include "topology/nvidia_smi_topo.hpp"
#include "topology/topology_json.hpp"
#include "topology/topology_source.hpp"

using namespace muon;
using namespace muon::plan;
using topology::Machine;

namespace {

std::string read(const std::string& path) {
  return muon::testing::read_text(path);
}

Machine fixture(const std::string& name) {
  const std::string path = std::string(MUON_TOPOLOGY_FIXTURES) + "/" + name;
  return topology::job_machine(topology::parse_topology_text(read(path), name).machine, 0);
}

const ModelConfig& model(const std::string& file) {
  static std::map<std::string, ModelConfig> cache;
  auto it = cache.find(file);
  if (it == cache.end()) {
    it = cache.emplace(file, load_model_config(std::string(MUON_MODEL_CONFIGS) + "/" + file)).first;
  }
  return it->second;
}

// Plans about structure (placement, owners, paths), whatever their memory: the memory model has
// tests of its own below.
PlanRequest request(const std::string& placement, int per_domain) {
  PlanRequest r;
  r.placement = placement;
  r.offload_per_domain = per_domain;
  r.memory.refuse = false;
  return r;
}

std::vector<int> server_gpus(const Plan& p) {
  std::vector<int> out;
  for (const auto& s : p.servers) out.push_back(s.gpu);
  return out;
}

// Invariants every plan keeps.
void check_plan(const Plan& p) {
  // Each parameter has exactly one owner, and the owners' lists partition the parameters.
  std::vector<int> owned(p.parameters.size(), 0);
  for (const auto& s : p.servers) {
    double ns = 0;
    for (int i : s.owns) {
      ++owned[i];
      EXPECT_EQ(p.parameters[i].owner, s.id);
      ns += p.parameters[i].cost_s;
    }
    EXPECT_NEAR(s.load.ns_s, ns, 1e-9 * (1 + ns));
  }
  for (size_t i = 0; i < owned.size(); ++i) EXPECT_EQ(owned[i], 1) << p.parameters[i].matrix.name;
  EXPECT_LE(p.lpt.makespan, p.lpt.list_bound() * (1 + 1e-12));
  // Relays: the owner in its own domain, a server of the domain elsewhere (or none).
  for (const auto& par : p.parameters) {
    ASSERT_EQ(par.relay.size(), p.domains.size());
    const int owner_domain = p.servers[par.owner].domain;
    for (size_t d = 0; d < p.domains.size(); ++d) {
      if (static_cast<int>(d) == owner_domain) {
        EXPECT_EQ(par.relay[d], par.owner);
      } else if (!p.domains[d].servers.empty()) {
        ASSERT_GE(par.relay[d], 0);
        EXPECT_EQ(p.servers[par.relay[d]].domain, static_cast<int>(d));
      }
    }
  }
  // Ranks: 0..n-1, local ranks contiguous per host, never on a dedicated server's GPU.
  std::set<int> server_positions;
  for (const auto& s : p.servers) server_positions.insert(s.gpu);
  std::map<std::string, int> next_local;
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& rank = p.ranks[r];
    EXPECT_EQ(rank.rank, static_cast<int>(r));
    EXPECT_EQ(rank.local_rank, next_local[rank.host]++);
    if (p.cost.placement == Placement::dedicated) {
      EXPECT_FALSE(server_positions.count(rank.gpu));
    }
    EXPECT_FALSE(rank.endpoints.empty());
    for (int e : rank.endpoints) {
      if (!p.domains[rank.domain].servers.empty()) {
        EXPECT_EQ(p.servers[e].domain, rank.domain);
      }
    }
  }
  const size_t expected_ranks = p.cost.placement == Placement::dedicated
                                    ? p.machine.gpus.size() - p.servers.size()
                                    : p.machine.gpus.size();
  EXPECT_EQ(p.ranks.size(), expected_ranks);
  // auto keeps a candidate within max(1 %, 1 ms) of the cheapest that fits (of all, when none
  // fits), and marks it.
  bool any_fits = false;
  for (const auto& c : p.candidates) any_fits = any_fits || c.fits;
  double best = 1e300;
  int chosen = 0;
  for (const auto& c : p.candidates) {
    if (c.fits || !any_fits) best = std::min(best, c.total_s);
    chosen += c.chosen ? 1 : 0;
  }
  EXPECT_LE(p.cost.total_s, best + std::max(0.01 * best, 1e-3) + 1e-12);
  EXPECT_EQ(chosen, 1);
  EXPECT_TRUE(p.cost.fits || !any_fits);
}

}  // namespace

TEST(Plan, HgxH100AutoCoLocatesOneServerPerGpu) {
  // Ranks pushing shards: a co-located server per GPU fits in a quarter of an H100 (19.6 GB).
  PlanRequest r = request("auto", 0);
  r.memory.client_mode = ClientMode::shard;
  const Plan p = build_plan(fixture("hgx_h100.txt"), model("llama3_8b.json"), r);
  EXPECT_TRUE(p.cost.fits);
  check_plan(p);
  ASSERT_EQ(p.domains.size(), 1u);
  EXPECT_EQ(p.cost.placement, Placement::colocated);
  EXPECT_EQ(p.cost.per_domain, 8);
  EXPECT_EQ(p.servers.size(), 8u);
  EXPECT_EQ(p.ranks.size(), 8u);
  for (const auto& r : p.ranks) {
    EXPECT_EQ(r.gpu_index, r.rank);
    EXPECT_EQ(p.servers[r.colocated_server].gpu, r.gpu);
    EXPECT_EQ(r.endpoints.size(), 8u);
  }
  // Dedicating a GPU costs 12.5 % of the step; co-locating costs the NS time spread over 8.
  const auto dedicated = std::find_if(p.candidates.begin(), p.candidates.end(), [](const auto& c) {
    return c.placement == Placement::dedicated && c.per_domain == 1;
  });
  ASSERT_NE(dedicated, p.candidates.end());
  EXPECT_GT(dedicated->total_s, 10 * p.cost.total_s);
  EXPECT_EQ(p.servers[3].socket_name, "muon-offloadd-gpu3.sock");
  // Every owner gets a buddy, spread by momentum bytes: no server keeps two owners' replicas.
  std::vector<int> kept(p.servers.size(), 0);
  for (const auto& sv : p.servers) {
    ASSERT_GE(sv.buddy, 0);
    EXPECT_NE(sv.buddy, sv.id);
    ++kept[sv.buddy];
  }
  EXPECT_EQ(*std::max_element(kept.begin(), kept.end()), 1);
}

TEST(Plan, HgxH100DedicatedServesFromTheHighestGpuOfEachNumaNode) {
  const Machine m = fixture("hgx_h100.txt");
  const Plan one = build_plan(m, model("llama3_8b.json"), request("dedicated", 1));
  check_plan(one);
  EXPECT_EQ(server_gpus(one), (std::vector<int>{7}));
  EXPECT_EQ(one.servers[0].numa_node, 1);
  ASSERT_EQ(one.ranks.size(), 7u);
  EXPECT_EQ(one.ranks[6].gpu_index, 6);
  EXPECT_EQ(one.servers[0].owns.size(), 224u);
  EXPECT_EQ(one.ranks[2].endpoints, (std::vector<int>{0}));
  EXPECT_EQ(one.ranks[2].numa_node, 0);

  const Plan two = build_plan(m, model("llama3_8b.json"), request("dedicated", 2));
  check_plan(two);
  EXPECT_EQ(server_gpus(two), (std::vector<int>{3, 7}));
  EXPECT_EQ(two.ranks[3].gpu_index, 4);
  EXPECT_NEAR(two.servers[0].load.ns_s, two.servers[1].load.ns_s, 0.02 * two.servers[0].load.ns_s);
  // One domain, no relays: each server keeps the other's replicas; one server has no buddy.
  EXPECT_EQ(two.servers[0].buddy, 1);
  EXPECT_EQ(two.servers[1].buddy, 0);
  EXPECT_EQ(one.servers[0].buddy, -1);
}

TEST(Plan, DgxA100SpreadsServersOverNumaNodes) {
  const Plan p =
      build_plan(fixture("dgx_a100.txt"), model("llama3_8b.json"), request("dedicated", 2));
  check_plan(p);
  // NUMA 3: GPU0-1, 1: GPU2-3, 7: GPU4-5, 5: GPU6-7; highest index first, one per NUMA node.
  EXPECT_EQ(server_gpus(p), (std::vector<int>{5, 7}));
  EXPECT_EQ(p.domains[0].link_bw, 300e9);
}

TEST(Plan, NvlinkBridgedPairsRelayAcrossPairs) {
  const Plan p = build_plan(fixture("pcie_nvlink_pairs.txt"), model("llama3_8b.json"),
                            request("dedicated", 1));
  check_plan(p);
  ASSERT_EQ(p.domains.size(), 2u);
  EXPECT_EQ(server_gpus(p), (std::vector<int>{1, 3}));
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_EQ(p.ranks[0].gpu_index, 0);
  EXPECT_EQ(p.ranks[1].gpu_index, 2);
  EXPECT_EQ(p.ranks[1].endpoints, (std::vector<int>{1}));
  // Each server relays, for its pair, the parameters the other one owns; relays and owners
  // share the host, so the partial sums cross PCIe.
  EXPECT_EQ(p.servers[0].relays.size(), p.servers[1].owns.size());
  EXPECT_EQ(p.servers[1].relays.size(), p.servers[0].owns.size());
  // So neither may keep the other's replicas (a takeover would change the reduction tree).
  EXPECT_EQ(p.servers[0].buddy, -1);
  EXPECT_EQ(p.servers[1].buddy, -1);
  EXPECT_GT(p.servers[0].load.bytes_in[static_cast<int>(LinkKind::pcie)], 0);
  EXPECT_EQ(p.servers[0].load.bytes_in[static_cast<int>(LinkKind::network)], 0);
  EXPECT_EQ(p.domains[0].link_bw, 100e9);  // NV4
}

TEST(Plan, PcieTwoSocketCoLocatesPerNumaNode) {
  const Plan p =
      build_plan(fixture("pcie_2socket.txt"), model("gpt2_124m.json"), request("colocated", 2));
  check_plan(p);
  ASSERT_EQ(p.domains.size(), 2u);
  EXPECT_EQ(p.domains[1].link, LinkKind::pcie);
  EXPECT_EQ(p.servers.size(), 4u);
  EXPECT_EQ(p.ranks.size(), 4u);
}

TEST(Plan, Gb200Nvl72OnePoolOverTheRack) {
  const Machine rack = fixture("gb200_nvl72.json");
  const Plan ded = build_plan(rack, model("llama3_70b.json"), request("dedicated", 4));
  check_plan(ded);
  ASSERT_EQ(ded.domains.size(), 1u);
  EXPECT_EQ(ded.domains[0].link, LinkKind::fabric);
  EXPECT_EQ(ded.domains[0].link_bw, 900e9);
  ASSERT_EQ(ded.servers.size(), 4u);
  const std::vector<std::string> hosts{"nvl72-tray00", "nvl72-tray04", "nvl72-tray09",
                                       "nvl72-tray13"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ded.servers[i].host, hosts[i]);
    EXPECT_EQ(ded.servers[i].gpu_index, 3);
  }
  EXPECT_EQ(ded.ranks.size(), 68u);
  EXPECT_EQ(ded.ranks[3].host, "nvl72-tray01");  // tray00 computes on GPU0-2 only
  EXPECT_EQ(ded.ranks[3].local_rank, 0);
  EXPECT_EQ(ded.ranks[40].endpoints, (std::vector<int>{0, 1, 2, 3}));
  for (const auto& s : ded.servers) EXPECT_EQ(s.relays.size(), 0u);  // one domain: no relays

  const Plan autop = build_plan(rack, model("llama3_70b.json"), request("auto", 0));
  check_plan(autop);
  // One dedicated server for 72 GPUs cannot keep up: its NS outlasts the overlap window.
  const auto alone = std::find_if(
      autop.candidates.begin(), autop.candidates.end(),
      [](const auto& c) { return c.placement == Placement::dedicated && c.per_domain == 1; });
  ASSERT_NE(alone, autop.candidates.end());
  EXPECT_GT(alone->ns_max_s, alone->window_s);
  EXPECT_GT(alone->exposed_s, 5.0);
  EXPECT_LT(autop.cost.total_s, alone->total_s);
}

TEST(Plan, MultiNodeHgxReducesInsideEachNodeThenAcrossTheNetwork) {
  const Plan p =
      build_plan(fixture("hgx_h100_2node.json"), model("llama3_8b.json"), request("dedicated", 1));
  check_plan(p);
  ASSERT_EQ(p.domains.size(), 2u);
  ASSERT_EQ(p.servers.size(), 2u);
  EXPECT_EQ(p.servers[0].host, "hgx-a");
  EXPECT_EQ(p.servers[1].host, "hgx-b");
  EXPECT_EQ(p.servers[1].node_rank, 1);
  EXPECT_EQ(p.ranks.size(), 14u);
  EXPECT_EQ(p.ranks[7].host, "hgx-b");
  EXPECT_EQ(p.ranks[7].local_rank, 0);
  EXPECT_EQ(p.ranks[7].endpoints, (std::vector<int>{1}));
  EXPECT_EQ(p.servers[0].relays.size(), p.servers[1].owns.size());
  const int net = static_cast<int>(LinkKind::network);
  const int nvl = static_cast<int>(LinkKind::nvlink);
  // Server 0 receives, over the network, one partial sum per parameter it owns (from hgx-b's
  // relay) and sends one per parameter it relays; over NVLink, 7 ranks' tiles per parameter.
  double owned_bytes = 0, relayed_bytes = 0;
  for (int i : p.servers[0].owns) owned_bytes += p.parameters[i].bytes;
  for (int i : p.servers[0].relays) relayed_bytes += p.parameters[i].bytes;
  EXPECT_DOUBLE_EQ(p.servers[0].load.bytes_in[net], owned_bytes + relayed_bytes);
  EXPECT_DOUBLE_EQ(p.servers[0].load.bytes_in[nvl], 7 * (owned_bytes + relayed_bytes));
}

TEST(Plan, ReplicatedNodesAndMoeExpertBatches) {
  const Machine four = topology::job_machine(fixture("hgx_h100.txt"), 4);
  const Plan p = build_plan(four, model("qwen3_30b_a3b.json"), request("dedicated", 1));
  check_plan(p);
  EXPECT_EQ(p.domains.size(), 4u);
  EXPECT_EQ(p.servers.size(), 4u);
  EXPECT_EQ(p.ranks.size(), 28u);
  // An expert batch is one parameter with one owner.
  const auto it = std::find_if(p.parameters.begin(), p.parameters.end(), [](const auto& x) {
    return x.matrix.name == "model.layers.0.mlp.experts.down_proj.weight";
  });
  ASSERT_NE(it, p.parameters.end());
  EXPECT_EQ(it->matrix.batch, 128);
  EXPECT_GE(it->owner, 0);
}

TEST(Plan, StepTimeGivenInsteadOfTokens) {
  PlanRequest r = request("dedicated", 1);
  r.step_time_s = 2.0;
  const Plan p = build_plan(fixture("hgx_h100.txt"), model("llama3_8b.json"), r);
  EXPECT_DOUBLE_EQ(p.cost.compute_all_s, 2.0);
  EXPECT_DOUBLE_EQ(p.cost.compute_s, 2.0 * 8 / 7);
  EXPECT_DOUBLE_EQ(p.training_flops, 0);
}

TEST(Plan, JsonCarriesWhatTheLauncherNeeds) {
  PlanRequest r = request("dedicated", 1);
  r.socket_dir = "/run/user/1000/muon-offload";
  const Plan p = build_plan(fixture("hgx_h100_2node.json"), model("llama3_8b.json"), r, "fixture");
  const auto doc = nlohmann::json::parse(write_plan_json(p));
  EXPECT_EQ(doc["schema"], "muon-offload-plan/1");
  EXPECT_EQ(doc["placement"], "dedicated");
  EXPECT_EQ(doc["chosen_by"], "request");
  EXPECT_EQ(doc["socket_dir"], "/run/user/1000/muon-offload");
  ASSERT_EQ(doc["nodes"].size(), 2u);
  const auto& node = doc["nodes"][1];
  EXPECT_EQ(node["host"], "hgx-b");
  EXPECT_EQ(node["node_rank"], 1);
  ASSERT_EQ(node["servers"].size(), 1u);
  EXPECT_EQ(node["servers"][0]["cuda_visible_devices"], "7");
  EXPECT_EQ(node["servers"][0]["socket_name"], "muon-offloadd-gpu7.sock");
  EXPECT_EQ(node["servers"][0]["numactl"], "--cpunodebind=1 --membind=1");
  EXPECT_EQ(node["compute"]["cuda_visible_devices"], "0,1,2,3,4,5,6");
  EXPECT_EQ(node["compute"]["nproc"], 7);
  EXPECT_EQ(node["compute"]["ranks"][0], 7);
  size_t owned = 0;
  for (const auto& s : doc["servers"]) owned += s["owns"].size();
  EXPECT_EQ(owned, 224u);
  EXPECT_EQ(doc["parameters"].size(), 224u);
  EXPECT_EQ(doc["parameters"][0]["name"], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(doc["parameters"][0]["relays"].size(), 2u);
  EXPECT_TRUE(doc["servers"][0].contains("buddy"));  // null: each server relays the other's
  EXPECT_TRUE(doc["servers"][0]["buddy"].is_null());
  EXPECT_EQ(doc["ranks"][0]["endpoints"][0]["socket_name"], "muon-offloadd-gpu7.sock");
  EXPECT_EQ(doc["ranks"][0]["endpoints"][0]["same_host"], true);
  EXPECT_EQ(doc["domains"][0]["kind"], "nvswitch");
  EXPECT_GT(doc["cost"]["total_s"].get<double>(), 0);
  EXPECT_LE(doc["lpt"]["makespan_s"].get<double>(), doc["lpt"]["list_bound_s"].get<double>());

  std::ostringstream table;
  print_plan_table(p, table);
  EXPECT_NE(table.str().find("muon-offloadd-gpu7.sock"), std::string::npos);
  EXPECT_NE(table.str().find("relay -> owner over the network"), std::string::npos);
}

TEST(Plan, BadRequestsAreClearErrors) {
  const Machine hgx = fixture("hgx_h100.txt");
  const ModelConfig& m = model("gpt2_124m.json");
  EXPECT_THROW(build_plan(hgx, m, request("sideways", 0)), InvalidArgument);
  EXPECT_THROW(build_plan(hgx, m, request("colocated", 9)), InvalidArgument);
  PlanRequest r = request("auto", 0);
  r.tokens_per_step = 0;
  EXPECT_THROW(build_plan(hgx, m, r), InvalidArgument);
  r = request("auto", 0);
  r.cost.schedule = "nope";
  EXPECT_THROW(build_plan(hgx, m, r), InvalidArgument);
  r = request("auto", 0);
  r.cost.ns_steps = 1000;
  EXPECT_THROW(build_plan(hgx, m, r), InvalidArgument);
  // One GPU: a dedicated server would leave nobody to train.
  Machine single;
  single.gpus.push_back(topology::Gpu{});
  try {
    build_plan(single, m, request("dedicated", 1));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no feasible plan"), std::string::npos) << e.what();
  }
  EXPECT_EQ(build_plan(single, m, request("auto", 0)).cost.placement, Placement::colocated);
}

TEST(Plan, DedicatedOnEveryGpuOfTheLargestDomainIsRefusedAsOneMoreIs) {
  const Machine hgx = fixture("hgx_h100.txt");
  const ModelConfig& m = model("gpt2_124m.json");
  for (int k : {8, 9}) {
    SCOPED_TRACE(k);
    try {
      build_plan(hgx, m, request("dedicated", k));
      FAIL() << "dedicated " << k << " on 8 GPUs was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--offload-per-domain " + std::to_string(k)), std::string::npos) << what;
    }
  }
  // auto placement with 8 per domain: only co-location can have 8, so that is the plan.
  const Plan p = build_plan(hgx, m, request("auto", 8));
  EXPECT_EQ(p.cost.placement, Placement::colocated);
  EXPECT_EQ(p.candidates.size(), 1u);
  // 7 dedicated is what the domain allows.
  EXPECT_EQ(build_plan(hgx, m, request("dedicated", 7)).servers.size(), 7u);
}

TEST(Plan, AutoRuleIsSaidMarkedAndItsToleranceSettable) {
  // NVL72 + Llama-3-8B, co-located: many server counts within 1 % of the cheapest; the default
  // rule takes the fewest servers among them, tolerance 0 the cheapest itself.
  const Machine rack = fixture("gb200_nvl72.json");
  PlanRequest r = request("colocated", 0);
  r.memory.client_mode = ClientMode::shard;  // every count fits: the rule alone decides
  const Plan fewest = build_plan(rack, model("llama3_8b.json"), r);
  check_plan(fewest);
  r.auto_tolerance = 0;
  r.auto_tolerance_s = 0;
  const Plan cheapest = build_plan(rack, model("llama3_8b.json"), r);
  check_plan(cheapest);
  double best = 1e300;
  for (const auto& c : cheapest.candidates) best = std::min(best, c.total_s);
  EXPECT_DOUBLE_EQ(cheapest.cost.total_s, best);
  EXPECT_LT(fewest.servers.size(), cheapest.servers.size());
  EXPECT_GT(fewest.cost.total_s, cheapest.cost.total_s);
  EXPECT_LE(fewest.cost.total_s, 1.01 * cheapest.cost.total_s + 1e-3);
  // A tolerance wide enough takes fewer servers still.
  r.auto_tolerance = 0.5;
  EXPECT_LT(build_plan(rack, model("llama3_8b.json"), r).servers.size(), fewest.servers.size());
  // The chosen candidate is marked in the candidates and in the table; the header says the rule.
  std::ostringstream table;
  print_plan_table(fewest, table);
  const std::string t = table.str();
  EXPECT_NE(t.find("the fewest servers within max(1 %, 1 ms) of the cheapest total"),
            std::string::npos)
      << t;
  const std::string row = "*  colocated  " + std::to_string(fewest.cost.per_domain) + " ";
  EXPECT_NE(t.find(row), std::string::npos) << t;
  const auto doc = nlohmann::json::parse(write_plan_json(fewest));
  int marked = 0;
  for (const auto& c : doc["candidates"]) {
    if (c["chosen"].get<bool>()) {
      ++marked;
      EXPECT_EQ(c["servers"], fewest.servers.size());
    }
  }
  EXPECT_EQ(marked, 1);
  r.auto_tolerance = -1;
  EXPECT_THROW(build_plan(rack, model("llama3_8b.json"), r), InvalidArgument);
}

TEST(Plan, RatesComeFromTheGpuModelOfTheTopology) {
  const ModelConfig& m = model("gpt2_124m.json");
  struct Row {
    const char* fixture;
    const char* key;
    GpuModelSource source;
    double bf16, memory;
  };
  const Row rows[] = {{"dgx_a100.txt", "a100", GpuModelSource::links, 312e12, 80e9},
                      {"hgx_h100.txt", "h100", GpuModelSource::links, 989e12, 80e9},
                      {"gb200_nvl72.json", "gb200", GpuModelSource::links, 2500e12, 186e9},
                      {"pcie_2socket.txt", "h100", GpuModelSource::assumed, 989e12, 80e9}};
  for (const auto& row : rows) {
    SCOPED_TRACE(row.fixture);
    const Plan p = build_plan(fixture(row.fixture), m, request("colocated", 1));
    EXPECT_EQ(p.gpu.model.key, row.key);
    EXPECT_EQ(p.gpu.source, row.source);
    EXPECT_DOUBLE_EQ(p.request.cost.gemm_flops, kGemmFractionOfPeak * row.bf16);
    EXPECT_DOUBLE_EQ(p.request.cost.train_peak_flops, row.bf16);
    EXPECT_DOUBLE_EQ(p.request.memory.gpu_memory_bytes, row.memory);
    // The NS time of a parameter follows the rate.
    EXPECT_DOUBLE_EQ(p.parameters[0].cost_s,
                     parameter_seconds(p.parameters[0].matrix, p.request.cost));
    std::ostringstream table;
    print_plan_table(p, table);
    EXPECT_NE(table.str().find("GPU: " + p.gpu.model.name), std::string::npos) << table.str();
  }
  // A100 NS is 989 / 312 times slower than H100's at the same FLOPs (launches aside).
  PlanRequest flops_only = request("dedicated", 1);
  flops_only.cost.launch_overhead_s = 0;
  const Plan a100 = build_plan(fixture("dgx_a100.txt"), m, flops_only);
  const Plan h100 = build_plan(fixture("hgx_h100.txt"), m, flops_only);
  EXPECT_NEAR(a100.servers[0].load.ns_s / h100.servers[0].load.ns_s, 989.0 / 312.0, 1e-9);
  // A flag, fp32 Newton-Schulz and explicit overrides.
  PlanRequest r = request("colocated", 1);
  r.gpu_model = "h200";
  r.cost.ns_precision = Precision::fp32;
  Plan p = build_plan(fixture("dgx_a100.txt"), m, r);
  EXPECT_EQ(p.gpu.source, GpuModelSource::flag);
  EXPECT_DOUBLE_EQ(p.request.cost.gemm_flops, kGemmFractionOfPeak * 67e12);
  EXPECT_DOUBLE_EQ(p.request.memory.gpu_memory_bytes, 141e9);
  r.gemm_flops = 500e12;
  r.train_peak_flops = 900e12;
  r.gpu_memory_bytes = 40e9;
  p = build_plan(fixture("dgx_a100.txt"), m, r);
  EXPECT_DOUBLE_EQ(p.request.cost.gemm_flops, 500e12);
  EXPECT_DOUBLE_EQ(p.request.cost.train_peak_flops, 900e12);
  EXPECT_DOUBLE_EQ(p.request.memory.gpu_memory_bytes, 40e9);
  r.gpu_model = "v100";
  EXPECT_THROW(build_plan(fixture("dgx_a100.txt"), m, r), InvalidArgument);
}

TEST(Plan, ServerMemoryIsWhatTheDataPlaneAllocates) {
  // GPT-2 small on one HGX node, one dedicated server (GPU7) and 7 compute ranks.
  const ModelConfig& m = model("gpt2_124m.json");
  double n = 0;
  for (const auto& x : m.muon) n += static_cast<double>(x.elements());
  PlanRequest r = request("dedicated", 1);
  const Plan p = build_plan(fixture("hgx_h100.txt"), m, r);
  const ServerMemory& mem = p.servers[0].memory;
  EXPECT_DOUBLE_EQ(mem.momentum, 4 * n);           // no backup: a step runs in scratch
  EXPECT_DOUBLE_EQ(mem.buffers, 8 * n);            // reduced gradient and update
  EXPECT_DOUBLE_EQ(mem.contributions, 7 * 4 * n);  // server_reduce: one whole buffer per rank
  EXPECT_DOUBLE_EQ(mem.rings, 7 * 16 * 4.0 * (1 << 20));  // 7 sessions x (8 + 8) x 4 MiB
  // The largest batch: 28.3 M elements (under the 2^26 cap), taken by each of three groups of
  // one Newton-Schulz shape: c_fc [3072, 768] x 12, the MLP's c_proj [768, 3072] x 12, and
  // 768 x 768 x 48 (c_attn's 3 row blocks and the attention's c_proj, 12 layers each). Its
  // momenta, gradients and updates in scratch: 12 bytes an element. The largest workspace is
  // the 48 square matrices' (the most Gram products).
  const double batch = 12.0 * 768 * 3072;
  EXPECT_DOUBLE_EQ(mem.scratch, 12 * batch);
  const MuonMatrix square{"768 x 768 x 48", 768, 768, 48, 1, false};
  EXPECT_DOUBLE_EQ(mem.workspace, ns_workspace_bytes(square, Precision::bf16));
  const MuonMatrix fc_twelve{"fc x 12", 3072, 768, 12, 1, false};
  EXPECT_GT(mem.workspace, ns_workspace_bytes(fc_twelve, Precision::bf16));
  EXPECT_DOUBLE_EQ(mem.context, 1.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(mem.budget, 80e9);
  EXPECT_TRUE(mem.fits());
  // A [768, 3072] bf16 workspace: gathered fp32 blocks, two bf16 copies of X, A and B (768^2).
  const MuonMatrix fc{"fc", 3072, 768, 1, 1, false};
  EXPECT_DOUBLE_EQ(ns_workspace_bytes(fc, Precision::bf16),
                   4.0 * 3072 * 768 + 4.0 * 3072 * 768 + 4.0 * 768 * 768 + 32.0 * (1 << 20));
  // shard: the ranks' pushes add up to one copy.
  r.memory.client_mode = ClientMode::shard;
  const Plan s = build_plan(fixture("hgx_h100.txt"), m, r);
  EXPECT_NEAR(s.servers[0].memory.contributions, 4 * n, 1e-6 * n);
  // A relay keeps its domain's buffers, and the owner one partial sum per relaying domain.
  const Plan two = build_plan(fixture("hgx_h100_2node.json"), m, request("dedicated", 1));
  double owned = 0, relayed = 0;
  for (int i : two.servers[0].owns)
    owned += static_cast<double>(two.parameters[i].matrix.elements());
  for (int i : two.servers[0].relays)
    relayed += static_cast<double>(two.parameters[i].matrix.elements());
  EXPECT_DOUBLE_EQ(two.servers[0].memory.momentum, 4 * owned);
  EXPECT_DOUBLE_EQ(two.servers[0].memory.buffers, 8 * (owned + relayed));
  EXPECT_DOUBLE_EQ(two.servers[0].memory.contributions, 4 * (7 * (owned + relayed) + owned));
}

TEST(Plan, MemoryThatDoesNotFitIsRefusedOrWarnedAndAutoPrefersWhatFits) {
  // Llama-3-70B co-located on one HGX H100 node: ~8.6 B parameters' momentum per GPU, far over
  // a quarter of 80 GB.
  const Machine hgx = fixture("hgx_h100.txt");
  PlanRequest r = request("colocated", 8);
  r.memory.refuse = true;
  try {
    build_plan(hgx, model("llama3_70b.json"), r);
    FAIL() << "70B co-located on 8 GPUs was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not fit in GPU memory"), std::string::npos) << what;
    EXPECT_NE(what.find("server "), std::string::npos) << what;
    EXPECT_NE(what.find("of its 20.0 GB"), std::string::npos) << what;
    EXPECT_NE(what.find("--client-mode shard"), std::string::npos) << what;
  }
  // warn: the plan, with a warning per server.
  r.memory.refuse = false;
  const Plan warned = build_plan(hgx, model("llama3_70b.json"), r);
  EXPECT_FALSE(warned.cost.fits);
  ASSERT_EQ(warned.warnings.size(), 1u);  // one line for the 8 servers
  EXPECT_NE(warned.warnings[0].find("8 servers (0, 1, 2, 3, 4, 5, 6, 7)"), std::string::npos)
      << warned.warnings[0];
  EXPECT_NE(warned.warnings[0].find("they will not start"), std::string::npos)
      << warned.warnings[0];
  std::ostringstream table;
  print_plan_table(warned, table);
  EXPECT_NE(table.str().find("WARNINGS"), std::string::npos);
  EXPECT_NE(table.str().find(" > 20.0"), std::string::npos) << table.str();

  // auto for Llama-3-8B on one HGX node, ranks pushing whole gradients: every co-located
  // candidate needs a buffer per rank and does not fit; the plan is the cheapest that does, and
  // says what it passed over.
  PlanRequest a = request("auto", 0);
  a.memory.refuse = true;
  const Plan p = build_plan(hgx, model("llama3_8b.json"), a);
  check_plan(p);
  EXPECT_TRUE(p.cost.fits);
  EXPECT_EQ(p.cost.placement, Placement::dedicated);
  bool cheaper_unfit = false;
  for (const auto& c : p.candidates) {
    cheaper_unfit = cheaper_unfit || (!c.fits && c.total_s < p.cost.total_s);
  }
  EXPECT_TRUE(cheaper_unfit) << "no cheaper candidate was passed over for memory";
  bool said = false;
  for (const auto& w : p.warnings) said = said || w.find("cheaper candidates do not fit") == 0;
  EXPECT_TRUE(said);
  // An assumed GPU model never refuses: PCIe boxes say nothing of their GPUs.
  PlanRequest big = request("colocated", 2);
  big.memory.refuse = true;
  const Plan assumed = build_plan(fixture("pcie_2socket.txt"), model("llama3_70b.json"), big);
  EXPECT_EQ(assumed.gpu.source, GpuModelSource::assumed);
  EXPECT_FALSE(assumed.cost.fits);
  ASSERT_FALSE(assumed.warnings.empty());
  EXPECT_NE(assumed.warnings[0].find("pass --gpu-model"), std::string::npos) << assumed.warnings[0];
}
