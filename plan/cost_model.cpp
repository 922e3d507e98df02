#include "plan/cost_model.hpp"

#include <algorithm>

#include "plan/ns_cost.hpp"

namespace muon::plan {

const char* placement_name(Placement p) {
  return p == Placement::dedicated ? "dedicated" : "colocated";
}

const char* link_kind_name(LinkKind kind) {
  switch (kind) {
    case LinkKind::nvlink:
      return "nvlink";
    case LinkKind::fabric:
      return "fabric";
    case LinkKind::pcie:
      return "pcie";
    case LinkKind::network:
      return "network";
  }
  return "?";
}

double ns_seconds(double flops, const CostSettings& s) {
  return flops / (s.gemm_flops * s.gemm_efficiency);
}

double parameter_seconds(const MuonMatrix& m, const CostSettings& s) {
  return ns_seconds(ns_run_flops(m, s.ns_steps, s.algorithm), s) +
         3.0 * s.ns_steps * s.launch_overhead_s;
}

double training_flops(const ModelConfig& model, double tokens_per_step) {
  return 6.0 * static_cast<double>(model.active_params()) * tokens_per_step;
}

LinkKind domain_link(topology::DomainKind kind) {
  switch (kind) {
    case topology::DomainKind::fabric:
      return LinkKind::fabric;
    case topology::DomainKind::nvswitch:
    case topology::DomainKind::nvlink:
      return LinkKind::nvlink;
    case topology::DomainKind::pcie:
      return LinkKind::pcie;
  }
  return LinkKind::pcie;
}

double link_bandwidth(LinkKind kind, const topology::Gpu& gpu, const CostSettings& s) {
  int max_links = 0, sum_links = 0;
  for (auto [peer, links] : gpu.nvlink_peers) {
    max_links = std::max(max_links, links);
    sum_links += links;
  }
  switch (kind) {
    case LinkKind::fabric:
      return (max_links > 0 ? max_links : 18) * s.fabric_link_bw;
    case LinkKind::nvlink:
      if (gpu.nvswitch) return std::max(max_links, 1) * s.nvlink_link_bw;
      return std::max(sum_links, 1) * s.nvlink_link_bw;
    case LinkKind::pcie:
      return s.pcie_bw;
    case LinkKind::network:
      return s.network_bw;
  }
  return s.pcie_bw;
}

double ServerLoad::link_s() const {
  double t = 0;
  for (int k = 0; k < kLinkKinds; ++k) {
    if (bandwidth[k] <= 0) continue;
    t = std::max({t, bytes_in[k] / bandwidth[k], bytes_out[k] / bandwidth[k]});
  }
  return t;
}

double server_exposed_seconds(Placement placement, const ServerLoad& load, LinkKind intra,
                              double window_s, const CostSettings& s) {
  const double link = load.link_s();
  if (placement == Placement::colocated) {
    return s.colocated_interference * load.ns_s + std::max(0.0, link - window_s);
  }
  const double bw = load.bandwidth[static_cast<int>(intra)];
  const double tail = load.max_job_s + (bw > 0 ? load.max_job_bytes / bw : 0.0);
  return std::max(0.0, std::max(load.ns_s, link) - window_s) + tail;
}

}  // namespace muon::plan
