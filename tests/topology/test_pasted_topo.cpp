// nvidia-smi topo text as people paste it (terminal copies, web pages, ANSI escapes, CRLF, old
// drivers): every form parses to the same machine as the tab-separated original, and malformed
// text still gets an error that names the line.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "smi_text.hpp"
#include "topology/domains.hpp"
#include "topology/nvidia_smi_topo.hpp"

using namespace muon;
using namespace muon::topology;

namespace {

const std::string kFixtures = MUON_TOPOLOGY_FIXTURES;

std::string fixture(const std::string& name) {
  return muon::testing::topology_fixture(name);
}

// A machine in one line per GPU and NIC, for failure messages.
std::string describe(const Machine& m) {
  std::ostringstream out;
  for (const auto& g : m.gpus) {
    out << "GPU" << g.index << " numa " << g.numa_node << " nvswitch " << g.nvswitch << " nv{";
    for (auto [p, c] : g.nvlink_peers) out << p << ":" << c << " ";
    out << "}\n";
  }
  for (const auto& n : m.nics) {
    out << n.name << " (" << n.device << ") {";
    for (const auto& [g, l] : n.gpu_link) out << g << ":" << l << " ";
    out << "}\n";
  }
  return out.str();
}

void expect_same_machine(const Machine& got, const Machine& want, const std::string& what) {
  EXPECT_TRUE(got == want) << what << "\ngot:\n" << describe(got) << "want:\n" << describe(want);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string join(const std::vector<std::string>& lines, const std::string& eol = "\n") {
  std::string out;
  for (const auto& l : lines) out += l + eol;
  return out;
}

// Tabs to spaces at tab stops of `width`, as a terminal shows them and a copy keeps them.
std::string expand_tabs(const std::string& text, size_t width) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(text)) {
    std::string o;
    for (char ch : line) {
      if (ch == '\t') {
        do o += ' ';
        while (o.size() % width != 0);
      } else {
        o += ch;
      }
    }
    out.push_back(o);
  }
  return join(out);
}

// Every run of tabs and spaces as one space, lines trimmed: what a web page's HTML shows.
std::string single_spaces(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex runs("[ \t]+");
  for (const auto& line : lines_of(text)) {
    std::string o = std::regex_replace(line, runs, " ");
    if (!o.empty() && o.front() == ' ') o.erase(0, 1);
    if (!o.empty() && o.back() == ' ') o.pop_back();
    out.push_back(o);
  }
  return join(out);
}

// The header wrapped in the underline escapes a current driver prints on a terminal; `esc` false
// keeps only "[4m"/"[0m", as a web page shows them after dropping the ESC byte.
std::string ansi_header(const std::string& text, bool esc) {
  const std::string e = esc ? "\x1b" : "";
  auto lines = lines_of(text);
  for (auto& l : lines) {
    const auto b = l.find_first_not_of(" \t");
    if (b == std::string::npos || l.compare(b, 4, "GPU0") != 0) continue;
    l = l.substr(0, b) + e + "[4m" + l.substr(b) + e + "[0m";
    break;
  }
  return join(lines);
}

std::string crlf(const std::string& text) {
  return join(lines_of(text), "\r\n");
}

std::string indent(const std::string& text) {
  auto lines = lines_of(text);
  for (auto& l : lines) l = "    " + l;
  return join(lines);
}

// Spaces as the no-break spaces (U+00A0) that a copy from HTML brings, and a UTF-8 BOM in front.
std::string nbsp_and_bom(const std::string& text) {
  std::string out = "\xEF\xBB\xBF";
  for (char ch : expand_tabs(text, 8))
    out += ch == ' ' ? std::string("\xC2\xA0") : std::string(1, ch);
  return out;
}

struct Pasting {
  const char* name;
  std::function<std::string(const std::string&)> apply;
};

const std::vector<Pasting>& pastings() {
  static const std::vector<Pasting> all = {
      {"tabs to spaces (8)", [](const std::string& t) { return expand_tabs(t, 8); }},
      {"tabs to spaces (4)", [](const std::string& t) { return expand_tabs(t, 4); }},
      {"single spaces", single_spaces},
      {"CRLF", crlf},
      {"ANSI header", [](const std::string& t) { return ansi_header(t, true); }},
      {"ANSI header without ESC", [](const std::string& t) { return ansi_header(t, false); }},
      {"indented", indent},
      {"no-break spaces and BOM", nbsp_and_bom},
      {"ANSI + spaces + CRLF",
       [](const std::string& t) { return crlf(expand_tabs(ansi_header(t, true), 8)); }},
      {"web page (no ESC, single spaces, CRLF)",
       [](const std::string& t) { return crlf(single_spaces(ansi_header(t, false))); }},
  };
  return all;
}

std::vector<std::string> text_fixtures() {
  std::vector<std::string> out;
  for (const char* dir : {"", "pasted/"}) {
    for (const auto& e : std::filesystem::directory_iterator(kFixtures + "/" + dir)) {
      if (e.path().extension() == ".txt") out.push_back(dir + e.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

using muon::testing::expect_topo_error_mentions;

}  // namespace

TEST(PastedTopo, EachPastedFixtureIsItsTabSeparatedOriginal) {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"pasted/hgx_h100.terminal.txt", "hgx_h100.txt"},
      {"pasted/hgx_h100.webpage.txt", "hgx_h100.txt"},
      {"pasted/dgx_a100.ansi.txt", "dgx_a100.txt"},
      {"pasted/pcie_2socket.crlf.txt", "pcie_2socket.txt"},
      {"pasted/pcie_nvlink_pairs.indented_spaces.txt", "pcie_nvlink_pairs.txt"},
      {"pasted/hgx_h100_glued.terminal_ansi_crlf.txt", "hgx_h100_glued.txt"},
      {"pasted/h100_pcie_10nic.terminal.txt", "pasted/h100_pcie_10nic.tty_raw.txt"},
  };
  for (const auto& [pasted, original] : pairs) {
    expect_same_machine(parse_nvidia_smi_topo(fixture(pasted), "node0"),
                        parse_nvidia_smi_topo(fixture(original), "node0"), pasted);
  }
}

TEST(PastedTopo, EveryFixtureSurvivesEveryPasting) {
  const auto files = text_fixtures();
  ASSERT_GE(files.size(), 18u);
  for (const auto& file : files) {
    const std::string text = fixture(file);
    const Machine want = parse_nvidia_smi_topo(text);
    ASSERT_FALSE(want.gpus.empty()) << file;
    for (const auto& p : pastings()) {
      try {
        expect_same_machine(parse_nvidia_smi_topo(p.apply(text)), want, file + ", " + p.name);
      } catch (const InvalidArgument& e) {
        ADD_FAILURE() << file << ", " << p.name << ": " << e.what();
      }
    }
  }
}

TEST(PastedTopo, SpaceSeparatedHeaderIsAccepted) {
  // The form the old parser refused ("no header line starting with GPU0").
  const Machine m = parse_nvidia_smi_topo(
      "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
      "GPU0     X      NV4     0-7     0               N/A\n"
      "GPU1    NV4      X      0-7     0               N/A\n");
  ASSERT_EQ(m.gpus.size(), 2u);
  EXPECT_EQ(m.gpus[1].nvlink_peers, (std::map<int, int>{{0, 4}}));
  EXPECT_EQ(m.gpus[1].numa_node, 0);
}

TEST(PastedTopo, Dgx1HybridCubeMeshFromAWebPage) {
  const Machine m = parse_nvidia_smi_topo(fixture("pasted/dgx1_v100.webpage.txt"));
  ASSERT_EQ(m.gpus.size(), 8u);
  EXPECT_EQ(m.gpus[0].nvlink_peers, (std::map<int, int>{{1, 1}, {2, 1}, {3, 2}, {4, 2}}));
  EXPECT_EQ(m.gpus[7].nvlink_peers, (std::map<int, int>{{3, 1}, {4, 2}, {5, 1}, {6, 2}}));
  EXPECT_FALSE(m.gpus[0].nvswitch);
  EXPECT_EQ(m.gpus[0].numa_node, -1);  // no NUMA Affinity column on drivers of that time
  // NICs named by device in the header: name and device are the column's name.
  ASSERT_EQ(m.nics.size(), 4u);
  EXPECT_EQ(m.nics[1].name, "mlx5_2");
  EXPECT_EQ(m.nics[1].device, "mlx5_2");
  EXPECT_EQ(m.nics[1].gpu_link.at(4), "PIX");
  EXPECT_EQ(m.nics[2].gpu_link.at(2), "PIX");
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, DomainKind::nvlink);
  EXPECT_EQ(d[0].gpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(d[1].gpus, (std::vector<int>{4, 5, 6, 7}));
}

TEST(PastedTopo, OldDriverWithSocAndPaddedLines) {
  const Machine m = parse_nvidia_smi_topo(fixture("pasted/k80_mlx4.terminal_padded.txt"));
  ASSERT_EQ(m.gpus.size(), 4u);
  for (const auto& g : m.gpus) EXPECT_TRUE(g.nvlink_peers.empty());
  ASSERT_EQ(m.nics.size(), 1u);
  EXPECT_EQ(m.nics[0].device, "mlx4_0");
  EXPECT_EQ(m.nics[0].gpu_link.at(1), "PHB");
  EXPECT_EQ(m.nics[0].gpu_link.at(2), "SOC");
}

TEST(PastedTopo, TenNicsWithLegendAndEmptyTrailingCells) {
  const Machine m = parse_nvidia_smi_topo(fixture("pasted/h100_pcie_10nic.tty_raw.txt"), "h1");
  ASSERT_EQ(m.gpus.size(), 8u);
  ASSERT_EQ(m.nics.size(), 10u);
  EXPECT_EQ(m.nics[8].device, "mlx5_8");
  EXPECT_EQ(m.nics[8].host, "h1");
  EXPECT_EQ(m.nics[5].gpu_link.at(5), "PIX");
  EXPECT_EQ(m.nics[9].gpu_link.at(4), "NODE");
  EXPECT_EQ(m.nics[9].gpu_link.at(0), "SYS");
  EXPECT_EQ(m.gpus[3].numa_node, 0);
  EXPECT_EQ(m.gpus[4].numa_node, 1);
  const auto d = find_domains(m);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, DomainKind::pcie);
}

TEST(PastedTopo, WorkstationsAndOneGpu) {
  const Machine rtx = parse_nvidia_smi_topo(fixture("pasted/rtx_2gpu_phb.txt"));
  ASSERT_EQ(rtx.gpus.size(), 2u);
  EXPECT_TRUE(rtx.gpus[0].nvlink_peers.empty());
  EXPECT_EQ(rtx.gpus[1].numa_node, 0);

  const Machine ws = parse_nvidia_smi_topo(fixture("pasted/workstation_3gpu_nv4.txt"));
  ASSERT_EQ(ws.gpus.size(), 3u);
  EXPECT_EQ(ws.gpus[0].nvlink_peers, (std::map<int, int>{{1, 4}}));
  EXPECT_TRUE(ws.gpus[2].nvlink_peers.empty());
  const auto d = find_domains(ws);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(d[1].gpus, (std::vector<int>{2}));

  const Machine one = parse_nvidia_smi_topo(fixture("pasted/h200_single.tty_raw.txt"));
  ASSERT_EQ(one.gpus.size(), 1u);
  EXPECT_EQ(one.gpus[0].numa_node, 0);
  EXPECT_TRUE(one.nics.empty());
}

TEST(PastedTopo, LegendEndsTheMatrix) {
  // `nvidia-smi topo -m` and `topo -p2p r` pasted together: the second matrix is not read.
  const Machine m = parse_nvidia_smi_topo(
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
      "GPU0\t X \tNV4\t0-7\t0\n"
      "GPU1\tNV4\t X \t0-7\t0\n"
      "\nLegend:\n\n  X    = Self\n\n"
      " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n");
  EXPECT_EQ(m.gpus.size(), 2u);
}

TEST(PastedTopo, MalformedPastesNameTheLine) {
  const std::string header = "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n";
  expect_topo_error_mentions("GPU Topology:\nnothing here\n", "no header line starting with GPU0");
  expect_topo_error_mentions(
      "GPU0     X      NV4     0-7     0\nGPU1    NV4      X      0-7     0\n",
      "line 1: a matrix row ('GPU0 X ...') before any header line");
  expect_topo_error_mentions("    GPU0    GPU1    CPU Affinity    Power Draw\n",
                             "line 1: unknown header column 'Power' after 'CPU Affinity'");
  expect_topo_error_mentions("    GPU0    GPU1    GPU1    CPU Affinity\n",
                             "line 1: header column GPU1 twice");
  expect_topo_error_mentions("    GPU0    GPUx    CPU Affinity\n",
                             "line 1: header cell 'GPUx' is no GPU<i> or NIC column name");
  expect_topo_error_mentions(header +
                                 "GPU0     X      NV4     0-7     0\n"
                                 "GPU1    NV4      X      0-7     0\n"
                                 "GPU1    NV4      X      0-7     0\n",
                             "line 4: a second row for GPU1 (the first is line 3)");
  expect_topo_error_mentions(header + "GPU0     X      0-7     0\n",
                             "line 2: GPU0: 1 link cells for 2 columns");
  expect_topo_error_mentions(header + "GPU0     X      NV4     NV4    0-7     0\n",
                             "line 2: GPU0: 3 link cells for 2 columns");
  expect_topo_error_mentions(header + "GPU0     X      NVL4     0-7     0\n",
                             "line 2: GPU0: unknown link token 'NVL4'");
  expect_topo_error_mentions(header + "GPU0     X      NV4     0-7     0     1\n",
                             "line 2: GPU0: 3 fields after the link cells for 2 header columns");
  expect_topo_error_mentions(header + "GPU0     X      NV4     0-7     zero\nGPU1 NV4 X 0-7 0\n",
                             "line 2: GPU0: NUMA Affinity 'zero' is not a NUMA node");
  expect_topo_error_mentions(header + "GPU0     X      NV4     0..7     0\nGPU1 NV4 X 0-7 0\n",
                             "line 2: GPU0: CPU Affinity '0..7' is not a CPU list");
  expect_topo_error_mentions(header + "GPU0    NV4      X      0-7     0\nGPU1 NV4 X 0-7 0\n",
                             "line 2: GPU0: 'NV4' in column GPU0 (its own column holds X)");
  expect_topo_error_mentions(
      header + "GPU0     X      NV4     0-7     0\nGPU1 NV4 X 0-7 0\nGPU2 SYS SYS 0-7 0\n",
      "line 4: row GPU2 has no column in the header (line 1)");
  expect_topo_error_mentions(header + "GPU0     X      NV4     0-7     0\n" + header,
                             "line 3: a second header line (the first is line 1)");
  expect_topo_error_mentions(header + "GPU0     X      NV4     0-7     0\n",
                             "line 1: column GPU1 has no row");
  expect_topo_error_mentions(
      "        GPU0    GPU1    NIC0    CPU Affinity\n"
      "GPU0     X      SYS     PIX     0-7\n"
      "GPU1    SYS      X      SYS     0-7\n"
      "NIC0    PIX     NODE     X\n",
      "line 4: NIC0 -> GPU1 is NODE but GPU1 -> NIC0 is SYS (line 3)");
}
