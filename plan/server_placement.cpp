#include "plan/server_placement.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "core/error.hpp"

namespace muon::plan {

std::vector<int> pick_server_gpus(const topology::Machine& machine, const topology::Domain& domain,
                                  int k) {
  const int size = static_cast<int>(domain.gpus.size());
  if (k < 0 || k > size) {
    throw InvalidArgument("cannot place " + std::to_string(k) + " servers in domain " +
                          domain.label + " of " + std::to_string(size) + " GPUs");
  }
  // Hosts in order of first appearance, each with its GPU positions.
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> by_host;
  for (int pos : domain.gpus) {
    const auto& host = machine.gpus[pos].host;
    if (!by_host.count(host)) hosts.push_back(host);
    by_host[host].push_back(pos);
  }
  const int h = static_cast<int>(hosts.size());
  std::vector<int> quota(h, k / h);
  const int extra = k % h;
  for (int i = 0; i < extra; ++i) quota[static_cast<size_t>(i) * h / extra] += 1;

  std::vector<int> picked, spare;
  for (int hi = 0; hi < h; ++hi) {
    // NUMA groups, highest GPU index first within a group; groups ordered by their highest index.
    std::map<int, std::vector<int>> numa;
    for (int pos : by_host[hosts[hi]]) numa[machine.gpus[pos].numa_node].push_back(pos);
    std::vector<std::vector<int>> groups;
    for (auto& [node, members] : numa) {
      std::sort(members.begin(), members.end(),
                [&](int a, int b) { return machine.gpus[a].index > machine.gpus[b].index; });
      groups.push_back(members);
    }
    std::sort(groups.begin(), groups.end(), [&](const auto& a, const auto& b) {
      return machine.gpus[a.front()].index > machine.gpus[b.front()].index;
    });
    std::vector<int> order;
    for (size_t round = 0; order.size() < by_host[hosts[hi]].size(); ++round) {
      for (const auto& g : groups) {
        if (round < g.size()) order.push_back(g[round]);
      }
    }
    const int take = std::min(quota[hi], static_cast<int>(order.size()));
    picked.insert(picked.end(), order.begin(), order.begin() + take);
    spare.insert(spare.end(), order.begin() + take, order.end());
  }
  // Hosts with fewer GPUs than their quota: the rest from the other hosts' next picks.
  for (size_t i = 0; picked.size() < static_cast<size_t>(k) && i < spare.size(); ++i) {
    picked.push_back(spare[i]);
  }
  std::sort(picked.begin(), picked.end());
  return picked;
}

}  // namespace muon::plan
