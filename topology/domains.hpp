// NVLink domains: the sets of GPUs connected all-to-all over NVLink, the unit inside which
// gradients are reduced before they cross to another domain (architecture guide, section 6).
#pragma once

#include <string>
#include <vector>

#include "topology/machine.hpp"

namespace muon::topology {

/// How a domain's GPUs are connected.
enum class DomainKind {
  fabric,    ///< one GPU fabric clique (GB200 NVL72): may span hosts
  nvswitch,  ///< all GPUs of a host through NVSwitch (HGX/DGX)
  nvlink,    ///< all-to-all direct NVLink without NVSwitch (bridged pair, small mesh)
  pcie,      ///< no NVLink: one domain per (host, NUMA node)
};

/// One domain: positions into Machine::gpus, ascending.
struct Domain {
  DomainKind kind;
  std::vector<int> gpus;
  std::string label;  ///< "host:nvswitch", "cluster/clique 3", "host:numa1", ...
};

/// Partitions the GPUs into domains, every GPU in exactly one:
/// 1. GPUs with a fabric cluster and clique id form one domain per (cluster, clique), across hosts;
/// 2. on each host, the other GPUs with NVLink peers form cliques: a connected component that is
///    all-to-all is one domain; one that is not (a hybrid cube mesh) is cut greedily, lowest
///    index first, into cliques;
/// 3. GPUs without NVLink form one domain per (host, NUMA node).
/// Domains come out ordered by their lowest GPU position.
std::vector<Domain> find_domains(const Machine& machine);

/// "fabric", "nvswitch", "nvlink" or "pcie".
const char* domain_kind_name(DomainKind kind);

}  // namespace muon::topology
