#include "topology/domains.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace muon::topology {

const char* domain_kind_name(DomainKind kind) {
  switch (kind) {
    case DomainKind::fabric:
      return "fabric";
    case DomainKind::nvswitch:
      return "nvswitch";
    case DomainKind::nvlink:
      return "nvlink";
    case DomainKind::pcie:
      return "pcie";
  }
  return "?";
}

std::vector<Domain> find_domains(const Machine& machine) {
  const auto& gpus = machine.gpus;
  const int n = static_cast<int>(gpus.size());
  std::vector<bool> taken(n, false);
  std::vector<Domain> domains;

  // 1. Fabric cliques (NVL72), keyed by (cluster, clique), across hosts.
  std::map<std::pair<std::string, int>, std::vector<int>> cliques;
  for (int i = 0; i < n; ++i) {
    if (!gpus[i].fabric_cluster.empty() && gpus[i].fabric_clique >= 0) {
      cliques[{gpus[i].fabric_cluster, gpus[i].fabric_clique}].push_back(i);
      taken[i] = true;
    }
  }
  for (auto& [key, members] : cliques) {
    domains.push_back(
        {DomainKind::fabric, members, key.first + "/clique " + std::to_string(key.second)});
  }

  // 2. NVLink cliques per host. `linked(i, j)`: same host and an NVLink entry.
  auto linked = [&](int i, int j) {
    return gpus[i].host == gpus[j].host && gpus[i].nvlink_peers.count(gpus[j].index) > 0;
  };
  for (int i = 0; i < n; ++i) {
    if (taken[i] || gpus[i].nvlink_peers.empty()) continue;
    // Greedy clique from the lowest free index: add each later GPU linked to all members.
    std::vector<int> members{i};
    for (int j = i + 1; j < n; ++j) {
      if (taken[j] || gpus[j].nvlink_peers.empty()) continue;
      if (std::all_of(members.begin(), members.end(), [&](int m) { return linked(m, j); })) {
        members.push_back(j);
      }
    }
    for (int m : members) taken[m] = true;
    const bool nvswitch =
        std::all_of(members.begin(), members.end(), [&](int m) { return gpus[m].nvswitch; });
    const DomainKind kind = nvswitch ? DomainKind::nvswitch : DomainKind::nvlink;
    domains.push_back({kind, members,
                       gpus[i].host + (gpus[i].host.empty() ? "" : ":") + domain_kind_name(kind) +
                           " GPU" + std::to_string(gpus[i].index)});
  }

  // 3. PCIe-only: one domain per (host, NUMA node).
  std::map<std::tuple<std::string, int>, std::vector<int>> numa;
  for (int i = 0; i < n; ++i) {
    if (!taken[i]) numa[{gpus[i].host, gpus[i].numa_node}].push_back(i);
  }
  for (auto& [key, members] : numa) {
    const auto& [host, node] = key;
    domains.push_back({DomainKind::pcie, members,
                       host + (host.empty() ? "" : ":") + "numa" + std::to_string(node)});
  }
  std::sort(domains.begin(), domains.end(),
            [](const Domain& a, const Domain& b) { return a.gpus.front() < b.gpus.front(); });
  return domains;
}

}  // namespace muon::topology
