#include "topology/topology_json.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.hpp"
#include "topology/json_fields.hpp"

namespace muon::topology {
namespace {

const std::set<std::string>& link_classes() {
  static const std::set<std::string> classes{"PIX", "PXB", "PHB", "NODE", "SYS"};
  return classes;
}

Gpu read_gpu(const JsonFields& f, const std::string& host) {
  f.only({"index", "pci_bus_id", "numa_node", "nvswitch", "nvlink", "fabric", "model",
          "memory_bytes"});
  Gpu gpu;
  gpu.host = host;
  gpu.index = f.integer("index", 0, 4095);
  if (f.has("pci_bus_id")) {
    gpu.pci_bus_id = f.string("pci_bus_id");
    static const std::regex bdf("[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]");
    if (!std::regex_match(gpu.pci_bus_id, bdf)) {
      f.fail("pci_bus_id", "'" + gpu.pci_bus_id +
                               "' is not a PCI bus id of the form 0000:18:00.0 "
                               "(domain:bus:device.function, hex)");
    }
  }
  if (f.has("numa_node")) gpu.numa_node = f.integer("numa_node", -1, 4095);
  if (f.has("model")) gpu.model = f.string("model");
  if (f.has("memory_bytes")) gpu.memory_bytes = f.integer("memory_bytes", 1, int64_t{1} << 50);
  if (f.has("nvswitch")) gpu.nvswitch = f.boolean("nvswitch");
  if (f.has("nvlink")) {
    const auto links = f.array("nvlink");
    for (size_t i = 0; i < links.size(); ++i) {
      const JsonFields link = links.object(i);
      link.only({"peer", "links"});
      const int peer = link.integer("peer", 0, 4095);
      if (peer == gpu.index) link.fail("peer", "a GPU cannot be its own NVLink peer");
      if (gpu.nvlink_peers.count(peer)) {
        link.fail("peer", "GPU" + std::to_string(peer) + " is listed twice");
      }
      gpu.nvlink_peers[peer] = link.integer("links", 1, 1024);
    }
  }
  if (f.has("fabric")) {
    const JsonFields fabric = f.object("fabric");
    fabric.only({"cluster", "clique"});
    gpu.fabric_cluster = fabric.string("cluster");
    if (gpu.fabric_cluster.empty()) fabric.fail("cluster", "must not be empty");
    gpu.fabric_clique = fabric.integer("clique", 0, 1 << 30);
  }
  return gpu;
}

Nic read_nic(const JsonFields& f, const std::string& host) {
  f.only({"name", "device", "gpu_link"});
  Nic nic;
  nic.host = host;
  nic.name = f.string("name");
  if (f.has("device")) nic.device = f.string("device");
  if (f.has("gpu_link")) {
    const JsonFields links = f.object("gpu_link");
    for (const auto& key : links.keys()) {
      int index = -1;
      try {
        size_t used = 0;
        index = std::stoi(key, &used);
        if (used != key.size() || index < 0) index = -1;
      } catch (const std::exception&) {
      }
      if (index < 0) links.fail(key, "keys are GPU indices (\"0\", \"1\", ...)");
      const std::string cls = links.string(key);
      if (!link_classes().count(cls)) {
        links.fail(key, "link class '" + cls + "' is not one of PIX, PXB, PHB, NODE, SYS");
      }
      nic.gpu_link[index] = cls;
    }
  }
  return nic;
}

}  // namespace

Machine parse_topology_json(std::string_view text, std::string_view origin) {
  const JsonDocument doc(text, std::string(origin));
  const JsonFields root = doc.root();
  root.only({"schema", "hosts"});
  const std::string schema = root.string("schema");
  if (schema != kTopologySchema) {
    root.fail("schema", "'" + schema + "' is not supported (this reader knows '" +
                            std::string(kTopologySchema) + "')");
  }
  Machine machine;
  const auto hosts = root.array("hosts");
  if (hosts.size() == 0) root.fail("hosts", "must list at least one host");
  std::set<std::string> host_seen;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const JsonFields host = hosts.object(h);
    host.only({"name", "gpus", "nics"});
    const std::string name = host.string("name");
    if (name.empty() && hosts.size() > 1) {
      host.fail("name", "must not be empty when there are several hosts");
    }
    if (!host_seen.insert(name).second) host.fail("name", "'" + name + "' is listed twice");
    const auto gpus = host.array("gpus");
    const size_t first = machine.gpus.size();
    std::set<int> index_seen;
    for (size_t g = 0; g < gpus.size(); ++g) {
      const JsonFields gf = gpus.object(g);
      Gpu gpu = read_gpu(gf, name);
      if (!index_seen.insert(gpu.index).second) {
        gf.fail("index", std::to_string(gpu.index) + " is used by another GPU of this host");
      }
      machine.gpus.push_back(std::move(gpu));
    }
    // NVLink peers must be GPUs of this host, with the same count in both directions.
    for (size_t g = first; g < machine.gpus.size(); ++g) {
      const Gpu& gpu = machine.gpus[g];
      for (auto [peer, count] : gpu.nvlink_peers) {
        const auto end = machine.gpus.end();
        const auto it = std::find_if(machine.gpus.begin() + static_cast<long>(first), end,
                                     [&](const Gpu& x) { return x.index == peer; });
        const JsonFields gf = gpus.object(g - first);
        if (it == end) {
          gf.fail("nvlink",
                  "peer GPU" + std::to_string(peer) + " is not a GPU of host '" + name + "'");
        }
        const auto back = it->nvlink_peers.find(gpu.index);
        if (back == it->nvlink_peers.end() || back->second != count) {
          gf.fail("nvlink", "GPU" + std::to_string(gpu.index) + " -> GPU" + std::to_string(peer) +
                                " has " + std::to_string(count) +
                                " links but the reverse entry differs");
        }
      }
    }
    if (host.has("nics")) {
      const auto nics = host.array("nics");
      for (size_t n = 0; n < nics.size(); ++n) {
        const JsonFields nf = nics.object(n);
        Nic nic = read_nic(nf, name);
        for (const auto& [index, cls] : nic.gpu_link) {
          if (!index_seen.count(index)) {
            nf.fail("gpu_link",
                    "GPU" + std::to_string(index) + " is not a GPU of host '" + name + "'");
          }
        }
        machine.nics.push_back(std::move(nic));
      }
    }
  }
  return machine;
}

std::string write_topology_json(const Machine& machine) {
  using json = nlohmann::ordered_json;
  json hosts = json::array();
  auto host_entry = [&](const std::string& name) -> json& {
    for (auto& h : hosts) {
      if (h["name"] == name) return h;
    }
    hosts.push_back(json{{"name", name}, {"gpus", json::array()}});
    return hosts.back();
  };
  for (const auto& gpu : machine.gpus) {
    json g = json::object();
    g["index"] = gpu.index;
    if (!gpu.pci_bus_id.empty()) g["pci_bus_id"] = gpu.pci_bus_id;
    if (gpu.numa_node >= 0) g["numa_node"] = gpu.numa_node;
    if (!gpu.model.empty()) g["model"] = gpu.model;
    if (gpu.memory_bytes > 0) g["memory_bytes"] = gpu.memory_bytes;
    if (gpu.nvswitch) g["nvswitch"] = true;
    if (!gpu.nvlink_peers.empty()) {
      json links = json::array();
      for (auto [peer, count] : gpu.nvlink_peers)
        links.push_back({{"peer", peer}, {"links", count}});
      g["nvlink"] = links;
    }
    if (!gpu.fabric_cluster.empty() && gpu.fabric_clique >= 0) {
      g["fabric"] = {{"cluster", gpu.fabric_cluster}, {"clique", gpu.fabric_clique}};
    }
    host_entry(gpu.host)["gpus"].push_back(g);
  }
  for (const auto& nic : machine.nics) {
    json n = {{"name", nic.name}};
    if (!nic.device.empty()) n["device"] = nic.device;
    json links = json::object();
    for (const auto& [index, cls] : nic.gpu_link) links[std::to_string(index)] = cls;
    n["gpu_link"] = links;
    json& h = host_entry(nic.host);
    if (!h.contains("nics")) h["nics"] = json::array();
    h["nics"].push_back(n);
  }
  json doc = json::object();
  doc["schema"] = kTopologySchema;
  doc["hosts"] = hosts;
  return doc.dump(2) + "\n";
}

}  // namespace muon::topology
