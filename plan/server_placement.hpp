// Which GPUs of a domain run the offload servers.
#pragma once

#include <vector>

#include "topology/domains.hpp"
#include "topology/machine.hpp"

namespace muon::plan {

/// Positions (into machine.gpus, ascending) of the `k` GPUs of `domain` that run servers
/// (k <= domain size). Spread for bandwidth and memory: over the domain's hosts first (each host
/// gets k / hosts, and the remainder goes to evenly spaced hosts, so an NVL72 clique with k = 4
/// serves from hosts 0, 4, 9, 13), then within a host alternately over its NUMA nodes, highest
/// GPU index first, so compute ranks keep the low indices (HGX: k = 1 -> GPU7, k = 2 -> GPU3,
/// GPU7).
std::vector<int> pick_server_gpus(const topology::Machine& machine, const topology::Domain& domain,
                                  int k);

}  // namespace muon::plan
