#include "topology/nvidia_smi_topo.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace muon::topology {
namespace {

[[noreturn]] void fail(int line_no, const std::string& what) {
  throw InvalidArgument("nvidia-smi topo text, line " + std::to_string(line_no) + ": " + what);
}

// One pasted line made plain: the SGR escapes nvidia-smi puts around its header on a terminal
// ("\x1b[4m", "\x1b[0m"; "[4m" where a web page dropped the ESC byte) removed; a UTF-8 BOM,
// no-break spaces (U+00A0, from HTML), a CR (CRLF line ends) and any stray ESC turned into spaces.
std::string plain_line(std::string_view raw) {
  static const std::regex sgr("\x1b?\\[[0-9;]*m");
  const std::string s = std::regex_replace(std::string(raw), sgr, "");
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xEF\xBB\xBF") == 0) {
      out += ' ';
      i += 2;
    } else if (s.compare(i, 2, "\xC2\xA0") == 0) {
      out += ' ';
      i += 1;
    } else if (s[i] == '\r' || s[i] == '\x1b' || s[i] == '\v' || s[i] == '\f') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

// The cells of a plain line: the runs of characters between tabs and spaces. nvidia-smi separates
// cells with one tab; a copy turns that tab into one or more spaces, so runs of either are one
// separator, and the empty cells nvidia-smi prints (an empty CPU affinity, the empty cell before
// "GPU NUMA ID", a NIC row's trailing fields) vanish.
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : line) {
    if (ch == ' ' || ch == '\t') {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
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

// The columns after the link columns, in the order nvidia-smi prints them.
enum class Field { cpu_affinity, numa_affinity, gpu_numa_id };

struct FieldSpec {
  Field field;
  std::vector<std::string> words;  // the header's words for it
  std::regex value;                // what a row may hold in it
  const char* what;                // what the value must be, for errors
};

const std::vector<FieldSpec>& field_specs() {
  static const std::vector<FieldSpec> specs = {
      {Field::cpu_affinity,
       {"CPU", "Affinity"},
       std::regex("N/A|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*"),
       "a CPU list such as 0-55,112-167"},
      {Field::numa_affinity,
       {"NUMA", "Affinity"},
       std::regex("N/A|[0-9]+(-[0-9]+)?"),
       "a NUMA node, a node range or N/A"},
      {Field::gpu_numa_id, {"GPU", "NUMA", "ID"}, std::regex("N/A|[0-9]+"), "a NUMA node or N/A"},
  };
  return specs;
}

std::string field_name(const FieldSpec& spec) {
  std::string out;
  for (const auto& w : spec.words) out += (out.empty() ? "" : " ") + w;
  return out;
}

struct Header {
  int line = 0;
  std::vector<std::string> columns;      // link columns: GPU<i>, NIC<j> or device names, in order
  std::vector<const FieldSpec*> fields;  // the columns after them
};

// The header, when `cells` (of line `line_no`) is one: its first cell is GPU0 and its second is
// no link token. A first cell GPU0 followed by a link token is a matrix row with no header above.
std::optional<Header> parse_header(const std::vector<std::string>& cells, int line_no) {
  if (cells.empty() || cells[0] != "GPU0") return std::nullopt;
  if (cells.size() > 1 && !link_tokens(cells[1]).empty()) {
    fail(line_no, "a matrix row ('GPU0 " + cells[1] +
                      " ...') before any header line; paste the header too (it starts with "
                      "'GPU0 GPU1 ...' or, on one GPU, 'GPU0 CPU Affinity')");
  }
  static const std::regex column_name("[A-Za-z][A-Za-z0-9_.:-]*");
  static const std::regex gpu_column("GPU[0-9]+");
  Header h;
  h.line = line_no;
  size_t i = 0;
  while (i < cells.size()) {
    const FieldSpec* spec = nullptr;
    for (const auto& s : field_specs()) {
      if (i + s.words.size() <= cells.size() &&
          std::equal(s.words.begin(), s.words.end(), cells.begin() + static_cast<long>(i))) {
        spec = &s;
      }
    }
    if (spec != nullptr) {
      if (std::find(h.fields.begin(), h.fields.end(), spec) != h.fields.end())
        fail(line_no, "header column '" + field_name(*spec) + "' twice");
      h.fields.push_back(spec);
      i += spec->words.size();
      continue;
    }
    const std::string& c = cells[i];
    if (!h.fields.empty()) {
      fail(line_no, "unknown header column '" + c + "' after '" + field_name(*h.fields.back()) +
                        "' (known: CPU Affinity, NUMA Affinity, GPU NUMA ID)");
    }
    if (!std::regex_match(c, column_name) || !link_tokens(c).empty() ||
        (c.rfind("GPU", 0) == 0 && !std::regex_match(c, gpu_column))) {
      fail(line_no, "header cell '" + c + "' is no GPU<i> or NIC column name");
    }
    if (std::find(h.columns.begin(), h.columns.end(), c) != h.columns.end())
      fail(line_no, "header column " + c + " twice");
    h.columns.push_back(c);
    ++i;
  }
  return h;
}

// One matrix row: its link tokens (one per header column) and the fields after them.
struct Row {
  int line = 0;
  std::vector<std::string> links;
  std::vector<std::string> fields;
};

bool looks_like_field(const std::string& cell) {
  return std::any_of(field_specs().begin(), field_specs().end(),
                     [&](const FieldSpec& s) { return std::regex_match(cell, s.value); });
}

Row parse_row(const std::vector<std::string>& cells, size_t columns, int line_no) {
  const std::string& name = cells[0];
  Row row;
  row.line = line_no;
  size_t i = 1;
  const auto count_error = [&] {
    fail(line_no, name + ": " + std::to_string(row.links.size()) + " link cells for " +
                      std::to_string(columns) + " columns");
  };
  for (; i < cells.size() && row.links.size() < columns; ++i) {
    auto toks = link_tokens(cells[i]);
    if (toks.empty()) {
      if (looks_like_field(cells[i])) count_error();
      fail(line_no, name + ": unknown link token '" + cells[i] + "'");
    }
    row.links.insert(row.links.end(), toks.begin(), toks.end());
  }
  // Link tokens past the last column are extra link cells, not trailing fields.
  for (; i < cells.size() && !link_tokens(cells[i]).empty(); ++i) {
    const auto toks = link_tokens(cells[i]);
    row.links.insert(row.links.end(), toks.begin(), toks.end());
  }
  if (row.links.size() != columns) count_error();
  row.fields.assign(cells.begin() + static_cast<long>(i), cells.end());
  return row;
}

int gpu_index(const std::string& column) {
  static const std::regex gpu_column("GPU([0-9]+)");
  std::smatch m;
  return std::regex_match(column, m, gpu_column) ? std::stoi(m[1].str()) : -1;
}

// The GPU of `row` (header column `name`): index, host and NUMA node from its trailing fields.
// Fewer fields than the header has columns: the leading ones are the empty ones.
Gpu gpu_of_row(const std::string& name, const Row& row, const Header& h, std::string_view host) {
  if (row.fields.size() > h.fields.size()) {
    fail(row.line, name + ": " + std::to_string(row.fields.size()) +
                       " fields after the link cells for " + std::to_string(h.fields.size()) +
                       " header columns");
  }
  Gpu gpu;
  gpu.index = gpu_index(name);
  gpu.host = std::string(host);
  const size_t skip = h.fields.size() - row.fields.size();
  for (size_t k = 0; k < row.fields.size(); ++k) {
    const FieldSpec& spec = *h.fields[skip + k];
    const std::string& v = row.fields[k];
    if (!std::regex_match(v, spec.value)) {
      fail(row.line, name + ": " + field_name(spec) + " '" + v + "' is not " + spec.what);
    }
    // "0" or a range "0-1" on some multi-node-per-socket boxes: take the first node.
    if (spec.field == Field::numa_affinity && v != "N/A") gpu.numa_node = std::stoi(v);
  }
  return gpu;
}

// NVSwitch boards: 4+ GPUs, all pairs linked, equal bonded count >= 12 (a bridged A100 PCIe pair
// is NV12 too, hence the 4).
void mark_nvswitch(Machine& machine) {
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
}

}  // namespace

Machine parse_nvidia_smi_topo(std::string_view text, std::string_view host) {
  std::optional<Header> header;
  std::map<std::string, Row> rows;            // by column name
  std::map<std::string, std::string> legend;  // NIC<j> -> device
  bool after_legend = false;
  static const std::regex legend_entry("(NIC[0-9]+):\\s*(\\S+)");

  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string line = plain_line(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    const auto cells = cells_of(line);
    if (cells.empty()) continue;
    if (!header) {
      header = parse_header(cells, line_no);
      continue;
    }
    std::smatch m;
    const std::string joined = cells.size() == 2 ? cells[0] + cells[1] : cells[0];
    if ((cells.size() <= 2) && std::regex_match(joined, m, legend_entry)) {
      legend[m[1].str()] = m[2].str();
      continue;
    }
    if (cells[0] == "Legend:" ||
        (cells.size() >= 2 && cells[0] == "NIC" && cells[1] == "Legend:")) {
      after_legend = true;  // the matrix is over (a `topo -p2p` matrix may follow)
      continue;
    }
    if (after_legend) continue;
    const std::string& name = cells[0];
    if (name == "GPU0" && (cells.size() == 1 || link_tokens(cells[1]).empty())) {
      fail(line_no, "a second header line (the first is line " + std::to_string(header->line) +
                        "); paste one machine's matrix at a time");
    }
    const auto& cols = header->columns;
    if (std::find(cols.begin(), cols.end(), name) == cols.end()) {
      if (gpu_index(name) >= 0) {
        fail(line_no, "row " + name + " has no column in the header (line " +
                          std::to_string(header->line) + ")");
      }
      continue;  // anything else: a title, a fence, a note
    }
    if (auto it = rows.find(name); it != rows.end()) {
      fail(line_no, "a second row for " + name + " (the first is line " +
                        std::to_string(it->second.line) + ")");
    }
    rows[name] = parse_row(cells, cols.size(), line_no);
  }
  if (!header) {
    throw InvalidArgument(
        "nvidia-smi topo text: no header line starting with GPU0 (a line such as "
        "'GPU0 GPU1 ... CPU Affinity NUMA Affinity'; is this the output of `nvidia-smi topo -m`?)");
  }

  const auto& cols = header->columns;
  Machine machine;
  std::vector<const Row*> gpu_rows;  // parallel to machine.gpus
  for (const auto& col : cols) {
    if (gpu_index(col) < 0) continue;
    auto it = rows.find(col);
    if (it == rows.end()) fail(header->line, "column " + col + " has no row");
    machine.gpus.push_back(gpu_of_row(col, it->second, *header, host));
    gpu_rows.push_back(&it->second);
  }

  // NVLink peers from the GPU columns; a GPU's own column holds X and no other does.
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    Gpu& gpu = machine.gpus[g];
    const Row& row = *gpu_rows[g];
    for (size_t c = 0; c < cols.size(); ++c) {
      const int peer = gpu_index(cols[c]);
      const std::string& tok = row.links[c];
      if (peer < 0) continue;
      if ((tok == "X") != (peer == gpu.index)) {
        fail(row.line,
             "GPU" + std::to_string(gpu.index) + ": '" + tok + "' in column " + cols[c] +
                 (tok == "X" ? " (X marks a GPU's own column)" : " (its own column holds X)"));
      }
      if (tok.rfind("NV", 0) == 0) gpu.nvlink_peers[peer] = std::stoi(tok.substr(2));
    }
  }
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    for (auto [peer, count] : machine.gpus[g].nvlink_peers) {
      auto it = std::find_if(machine.gpus.begin(), machine.gpus.end(),
                             [&](const Gpu& x) { return x.index == peer; });
      auto back = it->nvlink_peers.find(machine.gpus[g].index);
      if (back == it->nvlink_peers.end() || back->second != count) {
        fail(gpu_rows[g]->line, "GPU" + std::to_string(machine.gpus[g].index) + " -> GPU" +
                                    std::to_string(peer) + " is NV" + std::to_string(count) +
                                    " but the reverse entry differs");
      }
    }
  }

  // NICs from their columns in the GPU rows, checked against the NIC's own row where pasted.
  static const std::regex nic_column("NIC[0-9]+");
  for (size_t c = 0; c < cols.size(); ++c) {
    if (gpu_index(cols[c]) >= 0) continue;
    Nic nic;
    nic.name = cols[c];
    nic.host = std::string(host);
    if (auto it = legend.find(nic.name); it != legend.end()) {
      nic.device = it->second;
    } else if (!std::regex_match(nic.name, nic_column)) {
      nic.device = nic.name;  // older drivers name the column by device (mlx5_0)
    }
    const auto own = rows.find(nic.name);
    for (size_t g = 0; g < machine.gpus.size(); ++g) {
      const std::string& tok = gpu_rows[g]->links[c];
      if (tok == "X")
        fail(gpu_rows[g]->line,
             "GPU" + std::to_string(machine.gpus[g].index) + ": 'X' in column " + nic.name);
      nic.gpu_link[machine.gpus[g].index] = tok;
      if (own == rows.end()) continue;
      const auto gc =
          std::find(cols.begin(), cols.end(), "GPU" + std::to_string(machine.gpus[g].index));
      const std::string& back = own->second.links[static_cast<size_t>(gc - cols.begin())];
      if (back != tok) {
        fail(own->second.line,
             nic.name + " -> GPU" + std::to_string(machine.gpus[g].index) + " is " + back +
                 " but GPU" + std::to_string(machine.gpus[g].index) + " -> " + nic.name + " is " +
                 tok + " (line " + std::to_string(gpu_rows[g]->line) + ")");
      }
    }
    machine.nics.push_back(std::move(nic));
  }
  mark_nvswitch(machine);
  return machine;
}

}  // namespace muon::topology
