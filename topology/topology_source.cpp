#include "topology/topology_source.hpp"

#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "topology/nvidia_smi_topo.hpp"
#include "topology/topology_json.hpp"

namespace muon::topology {

LoadedTopology parse_topology_text(std::string_view text, std::string_view origin) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    return {parse_topology_json(text, origin), "JSON description " + std::string(origin)};
  }
  try {
    return {parse_nvidia_smi_topo(text), "nvidia-smi topo text " + std::string(origin)};
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(origin) + ": " + e.message());
  }
}

LoadedTopology load_topology(const std::string& spec, const DiscoveryOptions& discovery) {
  if (spec == "auto") {
    Machine m = discover_machine(discovery);
    if (m.gpus.empty()) {
      throw InvalidArgument("topology auto: NVML sees no GPU on this host");
    }
    std::string source = "live discovery (NVML) on " + m.gpus.front().host;
    return {std::move(m), std::move(source)};
  }
  std::ifstream f(spec);
  if (!f) throw InvalidArgument("cannot read topology file '" + spec + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_topology_text(ss.str(), spec);
}

Machine job_machine(const Machine& machine, int nodes) {
  if (machine.gpus.empty()) throw InvalidArgument("the topology has no GPU");
  if (nodes < 0) throw InvalidArgument("--nodes must be >= 0");
  const auto hosts = host_names(machine);
  Machine out;
  if (hosts.size() == 1) {
    const int copies = nodes == 0 ? 1 : nodes;
    for (int c = 0; c < copies; ++c) {
      const std::string name =
          copies == 1 && !hosts[0].empty() ? hosts[0] : "node" + std::to_string(c);
      for (Gpu g : machine.gpus) {
        g.host = name;
        out.gpus.push_back(std::move(g));
      }
      for (Nic n : machine.nics) {
        n.host = name;
        out.nics.push_back(std::move(n));
      }
    }
    return out;
  }
  if (nodes > static_cast<int>(hosts.size())) {
    throw InvalidArgument("--nodes " + std::to_string(nodes) + " asks for more hosts than the " +
                          std::to_string(hosts.size()) + " the topology describes");
  }
  const size_t keep = nodes == 0 ? hosts.size() : static_cast<size_t>(nodes);
  auto kept = [&](const std::string& h) {
    for (size_t i = 0; i < keep; ++i) {
      if (hosts[i] == h) return true;
    }
    return false;
  };
  for (const auto& g : machine.gpus) {
    if (kept(g.host)) out.gpus.push_back(g);
  }
  for (const auto& n : machine.nics) {
    if (kept(n.host)) out.nics.push_back(n);
  }
  return out;
}

}  // namespace muon::topology
