#include "plan/plan_json.hpp"

#include <nlohmann/json.hpp>

#include "plan/ns_cost.hpp"

namespace muon::plan {
namespace {

using json = nlohmann::ordered_json;

json per_kind(const std::array<double, kLinkKinds>& v) {
  json o = json::object();
  for (int k = 0; k < kLinkKinds; ++k) {
    if (v[k] > 0) o[link_kind_name(static_cast<LinkKind>(k))] = v[k];
  }
  return o;
}

std::string join_indices(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

json step_cost(const StepCost& c) {
  return {{"placement", placement_name(c.placement)},
          {"offload_per_domain", c.per_domain},
          {"servers", c.servers},
          {"compute_gpus", c.compute_gpus},
          {"compute_all_gpus_s", c.compute_all_s},
          {"compute_s", c.compute_s},
          {"gpu_share_s", c.share_s},
          {"overlap_window_s", c.window_s},
          {"ns_max_s", c.ns_max_s},
          {"link_max_s", c.link_max_s},
          {"exposed_s", c.exposed_s},
          {"total_s", c.total_s},
          {"memory_max_bytes", c.memory_max_bytes},
          {"memory_budget_bytes", c.memory_budget_bytes},
          {"fits", c.fits},
          {"chosen", c.chosen}};
}

json memory(const ServerMemory& m) {
  return {{"total_bytes", m.total()},
          {"budget_bytes", m.budget},
          {"momentum_bytes", m.momentum},
          {"gradient_update_bytes", m.buffers},
          {"step_scratch_bytes", m.scratch},
          {"contribution_bytes", m.contributions},
          {"ring_bytes", m.rings},
          {"workspace_bytes", m.workspace},
          {"context_bytes", m.context},
          {"fits", m.fits()}};
}

}  // namespace

std::string numactl_args(int numa_node) {
  if (numa_node < 0) return "";
  const std::string n = std::to_string(numa_node);
  return "--cpunodebind=" + n + " --membind=" + n;
}

std::string write_plan_json(const Plan& plan) {
  const auto& s = plan.request.cost;
  const auto& m = plan.machine;
  const Placement placement = plan.cost.placement;
  json doc;
  doc["schema"] = kPlanSchema;
  doc["model"] = {{"name", plan.model_name},
                  {"muon_params", plan.muon_params},
                  {"total_params", plan.total_params},
                  {"matrices", plan.parameters.size()}};
  doc["topology"] = {
      {"source", plan.topology_source}, {"gpus", m.gpus.size()}, {"hosts", plan.hosts}};
  doc["placement"] = placement_name(placement);
  doc["offload_per_domain"] = plan.cost.per_domain;
  doc["chosen_by"] = plan.placement_auto || plan.per_domain_auto ? "auto" : "request";
  doc["gpu"] = {{"model", plan.gpu.model.key},
                {"name", plan.gpu.model.name},
                {"source", gpu_model_source_name(plan.gpu.source)},
                {"how", plan.gpu.how},
                {"bf16_flops_per_s", plan.gpu.model.bf16_flops},
                {"fp32_flops_per_s", plan.gpu.model.fp32_flops},
                {"memory_bytes", plan.request.memory.gpu_memory_bytes}};
  doc["settings"] = {
      {"schedule", s.schedule},
      {"ns_steps", s.ns_steps},
      {"ns_algorithm", ns_algorithm_name(s.algorithm)},
      {"ns_precision", s.ns_precision == Precision::fp32 ? "fp32" : "bf16"},
      {"gemm_flops_per_s", s.gemm_flops},
      {"gemm_efficiency", s.gemm_efficiency},
      {"launch_overhead_s", s.launch_overhead_s},
      {"tokens_per_step",
       plan.request.step_time_s > 0 ? json(nullptr) : json(plan.request.tokens_per_step)},
      {"step_time_s",
       plan.request.step_time_s > 0 ? json(plan.request.step_time_s) : json(nullptr)},
      {"training_flops_per_step", plan.training_flops},
      {"train_peak_flops_per_s", s.train_peak_flops},
      {"mfu", s.mfu},
      {"nvlink_bytes_per_s_per_link", s.nvlink_link_bw},
      {"fabric_bytes_per_s_per_link", s.fabric_link_bw},
      {"pcie_bytes_per_s", s.pcie_bw},
      {"network_bytes_per_s", s.network_bw},
      {"wire_bytes_per_element", s.wire_bytes},
      {"overlap_fraction", s.overlap_fraction},
      {"colocated_interference", s.colocated_interference},
      {"client_mode", client_mode_name(plan.request.memory.client_mode)},
      {"colocated_memory_share", plan.request.memory.colocated_share},
      {"auto_tolerance", plan.request.auto_tolerance},
      {"auto_tolerance_s", plan.request.auto_tolerance_s}};
  doc["socket_dir"] = plan.request.socket_dir;
  doc["paths"] = {
      {"reduce",
       "compute ranks of each domain push a parameter's gradient tiles to parameters[].relays"
       "[domain] (the owner, in the owner's domain) over the domain's link; a relay sums its "
       "domain's contributions and forwards one partial sum to the owner over the network "
       "(pcie when both share a host); relay null: the ranks push straight to the owner"},
      {"broadcast",
       "the reverse: the owner sends the update to each relay over the same link, each relay "
       "to its domain's ranks"}};

  json domains = json::array();
  for (size_t d = 0; d < plan.domains.size(); ++d) {
    const auto& dp = plan.domains[d];
    json gpus = json::array();
    for (int pos : dp.domain.gpus)
      gpus.push_back({{"host", m.gpus[pos].host}, {"gpu", m.gpus[pos].index}});
    domains.push_back({{"id", d},
                       {"kind", topology::domain_kind_name(dp.domain.kind)},
                       {"label", dp.domain.label},
                       {"hosts", dp.hosts},
                       {"gpus", gpus},
                       {"link", link_kind_name(dp.link)},
                       {"link_bytes_per_s", dp.link_bw},
                       {"servers", dp.servers},
                       {"compute_ranks", dp.compute_ranks}});
  }
  doc["domains"] = domains;

  auto names = [&](const std::vector<int>& idx) {
    json a = json::array();
    for (int i : idx) a.push_back(plan.parameters[i].matrix.name);
    return a;
  };

  json nodes = json::array();
  for (size_t h = 0; h < plan.hosts.size(); ++h) {
    json servers = json::array();
    for (const auto& sv : plan.servers) {
      if (sv.node_rank != static_cast<int>(h)) continue;
      servers.push_back({{"id", sv.id},
                         {"gpu", sv.gpu_index},
                         {"cuda_visible_devices", std::to_string(sv.gpu_index)},
                         {"socket_name", sv.socket_name},
                         {"numa_node", sv.numa_node},
                         {"numactl", numactl_args(sv.numa_node)},
                         {"owns", names(sv.owns)}});
    }
    std::vector<int> gpus, ranks;
    for (const auto& r : plan.ranks) {
      if (r.node_rank != static_cast<int>(h)) continue;
      gpus.push_back(r.gpu_index);
      ranks.push_back(r.rank);
    }
    nodes.push_back({{"host", plan.hosts[h]},
                     {"node_rank", h},
                     {"servers", servers},
                     {"compute",
                      {{"gpus", gpus},
                       {"cuda_visible_devices", join_indices(gpus)},
                       {"nproc", gpus.size()},
                       {"ranks", ranks}}}});
  }
  doc["nodes"] = nodes;

  json servers = json::array();
  for (const auto& sv : plan.servers) {
    servers.push_back({{"id", sv.id},
                       {"host", sv.host},
                       {"node_rank", sv.node_rank},
                       {"gpu", sv.gpu_index},
                       {"domain", sv.domain},
                       {"placement", placement_name(placement)},
                       {"numa_node", sv.numa_node},
                       {"numactl", numactl_args(sv.numa_node)},
                       {"socket_name", sv.socket_name},
                       {"owns", names(sv.owns)},
                       {"relays", names(sv.relays)},
                       {"buddy", sv.buddy >= 0 ? json(sv.buddy) : json(nullptr)},
                       {"predicted",
                        {{"ns_flops", sv.load.ns_flops},
                         {"ns_s", sv.load.ns_s},
                         {"longest_parameter_s", sv.load.max_job_s},
                         {"link_s", sv.load.link_s()},
                         {"exposed_s", sv.exposed_s},
                         {"momentum_bytes", sv.load.momentum_bytes},
                         {"memory", memory(sv.memory)},
                         {"bytes_in", per_kind(sv.load.bytes_in)},
                         {"bytes_out", per_kind(sv.load.bytes_out)}}}});
  }
  doc["servers"] = servers;

  json ranks = json::array();
  for (const auto& r : plan.ranks) {
    json endpoints = json::array();
    for (int id : r.endpoints) {
      const auto& sv = plan.servers[id];
      endpoints.push_back({{"server", id},
                           {"host", sv.host},
                           {"socket_name", sv.socket_name},
                           {"same_host", sv.host == r.host}});
    }
    ranks.push_back(
        {{"rank", r.rank},
         {"host", r.host},
         {"node_rank", r.node_rank},
         {"local_rank", r.local_rank},
         {"gpu", r.gpu_index},
         {"domain", r.domain},
         {"numa_node", r.numa_node},
         {"numactl", numactl_args(r.numa_node)},
         {"colocated_server", r.colocated_server >= 0 ? json(r.colocated_server) : json(nullptr)},
         {"endpoints", endpoints}});
  }
  doc["ranks"] = ranks;

  json params = json::array();
  for (const auto& p : plan.parameters) {
    json shape = p.matrix.batch > 1 ? json::array({p.matrix.batch, p.matrix.rows, p.matrix.cols})
                                    : json::array({p.matrix.rows, p.matrix.cols});
    json relays = json::array();
    for (int r : p.relay) relays.push_back(r >= 0 ? json(r) : json(nullptr));
    params.push_back({{"name", p.matrix.name},
                      {"shape", shape},
                      {"row_blocks", p.matrix.row_blocks},
                      {"owner", p.owner},
                      {"relays", relays},
                      {"ns_flops", p.flops},
                      {"cost_s", p.cost_s},
                      {"bytes", p.bytes}});
  }
  doc["parameters"] = params;

  json cost = step_cost(plan.cost);
  cost["ns_fraction_of_step"] =
      plan.cost.compute_s > 0 ? plan.cost.ns_max_s / plan.cost.compute_s : 0.0;
  doc["cost"] = cost;
  doc["lpt"] = {{"makespan_s", plan.lpt.makespan},
                {"total_s", plan.lpt.total},
                {"longest_job_s", plan.lpt.max_job},
                {"lower_bound_s", plan.lpt.lower_bound()},
                {"list_bound_s", plan.lpt.list_bound()},
                {"graham_factor", lpt_graham_factor(static_cast<int>(plan.servers.size()))}};
  json candidates = json::array();
  for (const auto& c : plan.candidates) candidates.push_back(step_cost(c));
  doc["candidates"] = candidates;
  doc["warnings"] = plan.warnings;
  return doc.dump(2) + "\n";
}

}  // namespace muon::plan
