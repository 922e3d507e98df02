#include "topology/nvidia_smi_topo.hpp"

#include <algorithm>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace muon::topology {
namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : line) {
    if (ch == '\t') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(trim(cur));
  return out;
}

// A link cell: X (self), NV<k>, or a PCIe class. SOC is the pre-2017 name of SYS.
const std::regex& link_token() {
  static const std::regex re("X|NV[0-9]+|SYS|SOC|NODE|PHB|PXB|PIX");
  return re;
}

// Splits one cell into link tokens; a glued cell ("PXBNODE") yields two. Empty on failure.
std::vector<std::string> link_tokens(const std::string& cell) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < cell.size()) {
    std::smatch m;
    const std::string rest = cell.substr(pos);
    if (!std::regex_search(rest, m, link_token(), std::regex_constants::match_continuous))
      return {};
    out.push_back(m.str());
    pos += m.length();
  }
  return out;
}

[[noreturn]] void fail(int line_no, const std::string& what) {
  throw InvalidArgument("nvidia-smi topo text, line " + std::to_string(line_no) + ": " + what);
}

}  // namespace

Machine parse_nvidia_smi_topo(std::string_view text, std::string_view host) {
  std::istringstream in{std::string(text)};
  std::string line;
  int line_no = 0;
  std::vector<std::string> columns;  // link columns: GPU<i> and NIC<j>, in order
  bool has_gpu_numa_id = false;
  Machine machine;
  std::vector<std::vector<std::string>> gpu_links;  // per GPU row: its link tokens
  std::vector<int> gpu_line;
  bool in_nic_legend = false;
  static const std::regex gpu_name("GPU([0-9]+)"), nic_name("NIC([0-9]+)"),
      legend_entry("(NIC[0-9]+):\\s*(\\S+)");

  while (std::getline(in, line)) {
    ++line_no;
    const std::string t = trim(line);
    if (t.empty()) continue;
    if (columns.empty()) {
      // The header: the first line whose tab-separated cells start with GPU0.
      auto cells = split_tabs(t);
      if (!cells.empty() && cells[0] == "GPU0") {
        for (const auto& c : cells) {
          if (std::regex_match(c, gpu_name) || std::regex_match(c, nic_name)) columns.push_back(c);
          if (c == "GPU NUMA ID") has_gpu_numa_id = true;
        }
      }
      continue;
    }
    if (t.rfind("NIC Legend", 0) == 0) {
      in_nic_legend = true;
      continue;
    }
    std::smatch m;
    if (in_nic_legend && std::regex_match(t, m, legend_entry)) {
      for (auto& nic : machine.nics) {
        if (nic.name == m[1].str()) nic.device = m[2].str();
      }
      continue;
    }
    auto cells = split_tabs(t);
    const std::string& name = cells[0];
    const bool is_gpu = std::regex_match(name, m, gpu_name);
    const bool is_nic = !is_gpu && std::regex_match(name, nic_name);
    if (!is_gpu && !is_nic) continue;  // legend and anything else

    // Link cells, expanding glued ones, until one per column.
    std::vector<std::string> links;
    size_t i = 1;
    for (; i < cells.size() && links.size() < columns.size(); ++i) {
      if (cells[i].empty())
        fail(line_no, name + ": empty link cell " + std::to_string(links.size()));
      auto toks = link_tokens(cells[i]);
      if (toks.empty()) fail(line_no, name + ": unknown link token '" + cells[i] + "'");
      links.insert(links.end(), toks.begin(), toks.end());
    }
    if (links.size() != columns.size()) {
      fail(line_no, name + ": " + std::to_string(links.size()) + " link cells for " +
                        std::to_string(columns.size()) + " columns");
    }
    if (is_nic) {
      Nic nic;
      nic.name = name;
      nic.host = std::string(host);
      for (size_t c = 0; c < columns.size(); ++c) {
        std::smatch gm;
        if (std::regex_match(columns[c], gm, gpu_name))
          nic.gpu_link[std::stoi(gm[1].str())] = links[c];
      }
      machine.nics.push_back(nic);
      continue;
    }
    Gpu gpu;
    gpu.index = std::stoi(m[1].str());
    gpu.host = std::string(host);
    // Trailing fields: [CPU affinity] NUMA affinity [GPU NUMA ID]; CPU affinity may be empty.
    std::vector<std::string> rest;
    for (; i < cells.size(); ++i) {
      if (!cells[i].empty()) rest.push_back(cells[i]);
    }
    std::string numa;
    if (has_gpu_numa_id) {
      if (rest.size() >= 3)
        numa = rest[1];
      else if (rest.size() == 2)
        numa = rest[0];
    } else if (rest.size() >= 2) {
      numa = rest[1];
    }
    if (!numa.empty() && numa != "N/A") {
      // "0" or a range "0-1" on some multi-node-per-socket boxes: take the first node.
      try {
        gpu.numa_node = std::stoi(numa);
      } catch (const std::exception&) {
        fail(line_no, name + ": NUMA affinity '" + numa + "' is not a number");
      }
    }
    machine.gpus.push_back(gpu);
    gpu_links.push_back(links);
    gpu_line.push_back(line_no);
  }
  if (columns.empty()) {
    throw InvalidArgument(
        "nvidia-smi topo text: no header line starting with GPU0 (is this the "
        "output of `nvidia-smi topo -m`?)");
  }

  // NVLink peers from the GPU columns.
  std::vector<int> column_gpu(columns.size(), -1);
  for (size_t c = 0; c < columns.size(); ++c) {
    std::smatch gm;
    if (std::regex_match(columns[c], gm, gpu_name)) column_gpu[c] = std::stoi(gm[1].str());
  }
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    for (size_t c = 0; c < columns.size(); ++c) {
      const auto& tok = gpu_links[g][c];
      if (column_gpu[c] < 0) continue;
      if (tok == "X" && column_gpu[c] != machine.gpus[g].index) {
        fail(gpu_line[g], "GPU" + std::to_string(machine.gpus[g].index) +
                              ": 'X' (self) in column " + columns[c]);
      }
      if (tok.rfind("NV", 0) == 0)
        machine.gpus[g].nvlink_peers[column_gpu[c]] = std::stoi(tok.substr(2));
    }
  }
  // Every GPU column needs its row, and NVLink entries must be symmetric.
  for (int col : column_gpu) {
    if (col < 0) continue;
    if (std::none_of(machine.gpus.begin(), machine.gpus.end(),
                     [&](const Gpu& g) { return g.index == col; })) {
      throw InvalidArgument("nvidia-smi topo text: column GPU" + std::to_string(col) +
                            " has no row");
    }
  }
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    for (auto [peer, count] : machine.gpus[g].nvlink_peers) {
      auto it = std::find_if(machine.gpus.begin(), machine.gpus.end(),
                             [&](const Gpu& x) { return x.index == peer; });
      auto back = it->nvlink_peers.find(machine.gpus[g].index);
      if (back == it->nvlink_peers.end() || back->second != count) {
        fail(gpu_line[g], "GPU" + std::to_string(machine.gpus[g].index) + " -> GPU" +
                              std::to_string(peer) + " is NV" + std::to_string(count) +
                              " but the reverse entry differs");
      }
    }
  }
  // NVSwitch boards: 4+ GPUs, all pairs linked, equal bonded count >= 12 (a bridged A100 PCIe
  // pair is NV12 too, hence the 4).
  const size_t n = machine.gpus.size();
  bool all_to_all = n > 1;
  int common = -1;
  for (const auto& g : machine.gpus) {
    if (g.nvlink_peers.size() != n - 1) all_to_all = false;
    for (auto [peer, count] : g.nvlink_peers) {
      if (common < 0) common = count;
      if (count != common) all_to_all = false;
    }
  }
  if (all_to_all && n >= 4 && common >= 12) {
    for (auto& g : machine.gpus) g.nvswitch = true;
  }
  return machine;
}

}  // namespace muon::topology
