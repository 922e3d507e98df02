#include "plan/plan_table.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "plan/ns_cost.hpp"
#include "plan/plan_json.hpp"

namespace muon::plan {
namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string billions(int64_t n) {
  return fmt("%.2f B", static_cast<double>(n) / 1e9);
}

void print_rows(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line = "  ";
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out << line << '\n';
  }
}

// "node0:0-6" / "node0:7, node4:7, ..." : GPUs grouped by host, index runs collapsed.
std::string gpu_list(const Plan& plan, const std::vector<int>& positions, size_t max_hosts = 4) {
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> by_host;
  for (int pos : positions) {
    const auto& g = plan.machine.gpus[pos];
    if (!by_host.count(g.host)) hosts.push_back(g.host);
    by_host[g.host].push_back(g.index);
  }
  std::string out;
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (h == max_hosts) {
      out += ", ... (" + std::to_string(hosts.size()) + " hosts)";
      break;
    }
    auto idx = by_host[hosts[h]];
    std::sort(idx.begin(), idx.end());
    std::string runs;
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && idx[j + 1] == idx[j] + 1) ++j;
      if (!runs.empty()) runs += ',';
      runs += std::to_string(idx[i]);
      if (j > i) {
        runs += '-';
        runs += std::to_string(idx[j]);
      }
      i = j + 1;
    }
    out += (out.empty() ? "" : ", ") + hosts[h] + ":" + runs;
  }
  return out.empty() ? "-" : out;
}

// "61.2" or "61.2 > 20.0" when over budget.
std::string memory_cell(const ServerMemory& m) {
  std::string cell = fmt("%.1f", m.total() / 1e9);
  if (!m.fits()) cell += " > " + fmt("%.1f", m.budget / 1e9);
  return cell;
}

}  // namespace

void print_plan_table(const Plan& plan, std::ostream& out) {
  const auto& s = plan.request.cost;
  const auto& c = plan.cost;
  out << "muon-offload plan: " << plan.model_name << ", " << billions(plan.muon_params)
      << " Muon params in " << plan.parameters.size() << " matrices ("
      << billions(plan.total_params) << " total)\n";
  out << "  topology: " << plan.machine.gpus.size() << " GPUs on " << plan.hosts.size()
      << " host(s), " << plan.domains.size() << " domain(s)"
      << (plan.topology_source.empty() ? "" : "; from " + plan.topology_source) << '\n';
  out << "  placement: " << placement_name(c.placement) << ", " << c.per_domain
      << " server(s) per domain, " << c.servers << " in the pool";
  if (plan.placement_auto || plan.per_domain_auto) {
    const auto& r = plan.request;
    out << "\n  auto rule: of " << plan.candidates.size()
        << " candidates, the fewest servers within max(" << fmt("%.3g", 100 * r.auto_tolerance)
        << " %, " << fmt("%.3g", r.auto_tolerance_s * 1e3)
        << " ms) of the cheapest total that fits in memory, co-located on a tie "
           "(--auto-tolerance, --auto-tolerance-ms; marked * below)";
  }
  out << '\n';
  const auto& gpu = plan.gpu;
  out << "  GPU: " << gpu.model.name << " (" << gpu.how << "): dense bf16 "
      << fmt("%.0f", gpu.model.bf16_flops / 1e12) << " TFLOP/s, fp32 "
      << fmt("%.1f", gpu.model.fp32_flops / 1e12) << " TFLOP/s, "
      << fmt("%.0f", plan.request.memory.gpu_memory_bytes / 1e9) << " GB"
      << (plan.request.gpu_memory_bytes > 0 ? " (--gpu-memory-gb)" : "") << '\n';
  out << "  Newton-Schulz: " << s.schedule << " x" << s.ns_steps << ", "
      << ns_algorithm_name(s.algorithm) << " FLOP count, "
      << (s.ns_precision == Precision::fp32 ? "fp32" : "bf16") << " at "
      << fmt("%.0f", s.gemm_flops / 1e12) << " TFLOP/s"
      << (plan.request.gemm_flops > 0
              ? " (--gemm-tflops)"
              : " (" + fmt("%.0f", 100 * kGemmFractionOfPeak) + " % of the GPU's peak)")
      << " x " << fmt("%.2f", s.gemm_efficiency) << ", " << fmt("%.0f", s.launch_overhead_s * 1e6)
      << " us per launch\n";
  if (plan.request.step_time_s > 0) {
    out << "  training: step time " << fmt("%.3f", plan.request.step_time_s)
        << " s with every GPU training (given)\n";
  } else {
    out << "  training: " << fmt("%.3g", plan.request.tokens_per_step) << " tokens/step, "
        << fmt("%.3g", plan.training_flops) << " FLOP/step at " << fmt("%.0f", s.mfu * 100)
        << " % MFU of " << fmt("%.0f", s.train_peak_flops / 1e12) << " TFLOP/s"
        << (plan.request.train_peak_flops > 0 ? " (--train-peak-tflops)" : "") << '\n';
  }

  out << "\nDOMAINS\n";
  std::vector<std::vector<std::string>> rows = {
      {"ID", "KIND", "GPUS", "LINK", "SERVING", "COMPUTING"}};
  for (size_t d = 0; d < plan.domains.size(); ++d) {
    const auto& dp = plan.domains[d];
    std::vector<int> serving, computing;
    for (int id : dp.servers) serving.push_back(plan.servers[id].gpu);
    for (int r : dp.compute_ranks) computing.push_back(plan.ranks[r].gpu);
    rows.push_back({std::to_string(d), topology::domain_kind_name(dp.domain.kind),
                    std::to_string(dp.domain.gpus.size()),
                    std::string(link_kind_name(dp.link)) + " " + fmt("%.0f GB/s", dp.link_bw / 1e9),
                    gpu_list(plan, serving), gpu_list(plan, computing)});
  }
  print_rows(out, rows);

  out << "\nSERVERS (predicted per step)\n";
  rows = {{"ID", "HOST", "GPU", "NUMA", "SOCKET", "OWNS", "RELAYS", "NS TFLOP", "NS s", "LINK s",
           "EXPOSED s", "MOMENTUM GB", "MEMORY GB"}};
  const size_t n = plan.servers.size();
  const size_t show = 12;
  for (size_t i = 0; i < n; ++i) {
    if (n > show && i == show / 2) {
      rows.push_back(
          {"...", std::to_string(n - show) + " more", "", "", "", "", "", "", "", "", "", "", ""});
      i = n - show / 2;
    }
    const auto& sv = plan.servers[i];
    rows.push_back({std::to_string(sv.id), sv.host, std::to_string(sv.gpu_index),
                    sv.numa_node >= 0 ? std::to_string(sv.numa_node) : "-", sv.socket_name,
                    std::to_string(sv.owns.size()), std::to_string(sv.relays.size()),
                    fmt("%.1f", sv.load.ns_flops / 1e12), fmt("%.3f", sv.load.ns_s),
                    fmt("%.3f", sv.load.link_s()), fmt("%.3f", sv.exposed_s),
                    fmt("%.2f", sv.load.momentum_bytes / 1e9), memory_cell(sv.memory)});
  }
  print_rows(out, rows);
  const auto& mem = plan.request.memory;
  out << "  memory: what the server's GPU data plane allocates (plan/server_memory.hpp) with "
      << "ranks pushing in mode " << client_mode_name(mem.client_mode)
      << " (--client-mode); budget per server ";
  if (c.memory_budget_bytes > 0) {
    out << fmt("%.1f", c.memory_budget_bytes / 1e9) << " GB"
        << (c.placement == Placement::colocated
                ? " (" + fmt("%.0f", 100 * mem.colocated_share) +
                      " % of the GPU, --colocated-memory-share; the trainer keeps the rest)"
                : " (the whole GPU)");
  } else {
    out << "unknown (no GPU memory size)";
  }
  out << '\n';
  out << "  ownership: LPT over the pool, makespan " << fmt("%.3f", plan.lpt.makespan)
      << " s; lower bound max(avg, longest) " << fmt("%.3f", plan.lpt.lower_bound())
      << " s; guaranteed <= avg + longest = " << fmt("%.3f", plan.lpt.list_bound())
      << " s and <= " << fmt("%.3f", lpt_graham_factor(static_cast<int>(n))) << " x optimum\n";

  out << "\nPATHS\n";
  out << "  reduce: compute ranks -> the parameter's server in their domain over the domain link";
  if (plan.domains.size() > 1) out << "; relay -> owner over the network (pcie on one host)";
  out << "\n  broadcast: the reverse; each rank's endpoints are its domain's servers\n";
  out << "  binding: numactl --cpunodebind=N --membind=N with N the GPU's NUMA node\n";

  out << "\nCOST per step\n";
  out << "  compute " << fmt("%.3f", c.compute_s) << " s on " << c.compute_gpus << " GPUs ("
      << fmt("%.3f", c.compute_all_s) << " s on all " << plan.machine.gpus.size() << ")"
      << "; GPU share given up " << fmt("%.3f", c.share_s) << " s ("
      << fmt("%.1f", 100.0 * (plan.machine.gpus.size() - c.compute_gpus) /
                         static_cast<double>(plan.machine.gpus.size()))
      << " % of the GPUs)\n";
  out << "  busiest server: NS " << fmt("%.3f", c.ns_max_s) << " s ("
      << fmt("%.1f", c.compute_s > 0 ? 100.0 * c.ns_max_s / c.compute_s : 0.0)
      << " % of the compute step), links " << fmt("%.3f", c.link_max_s) << " s; overlap window "
      << fmt("%.3f", c.window_s) << " s\n";
  out << "  exposed " << fmt("%.3f", c.exposed_s) << " s; total cost " << fmt("%.3f", c.total_s)
      << " s (" << fmt("%.1f", c.compute_all_s > 0 ? 100.0 * c.total_s / c.compute_all_s : 0.0)
      << " % of the step)\n";

  if (!plan.warnings.empty()) {
    out << "\nWARNINGS\n";
    for (const auto& w : plan.warnings) out << "  " << w << '\n';
  }

  if (plan.candidates.size() > 1) {
    out << "\nCANDIDATES (cheapest first; * the plan)\n";
    rows = {{"", "PLACEMENT", "PER DOMAIN", "SERVERS", "GPU SHARE s", "EXPOSED s", "TOTAL s",
             "MEMORY GB", "FITS"}};
    // The cheapest few, the chosen one, and the cheapest of each placement so both costs are on
    // screen.
    std::vector<size_t> shown;
    for (size_t i = 0; i < plan.candidates.size() && i < 5; ++i) shown.push_back(i);
    for (size_t i = 0; i < plan.candidates.size(); ++i) {
      if (plan.candidates[i].chosen && i >= 5) shown.push_back(i);
    }
    for (Placement p : {Placement::dedicated, Placement::colocated}) {
      for (size_t i = 0; i < plan.candidates.size(); ++i) {
        if (plan.candidates[i].placement != p) continue;
        if (std::find(shown.begin(), shown.end(), i) == shown.end()) shown.push_back(i);
        break;
      }
    }
    for (size_t i : shown) {
      const auto& k = plan.candidates[i];
      rows.push_back({k.chosen ? "*" : "", placement_name(k.placement),
                      std::to_string(k.per_domain), std::to_string(k.servers),
                      fmt("%.4g", k.share_s), fmt("%.4g", k.exposed_s), fmt("%.4g", k.total_s),
                      fmt("%.1f", k.memory_max_bytes / 1e9),
                      k.memory_budget_bytes <= 0 ? "?" : (k.fits ? "yes" : "no")});
    }
    print_rows(out, rows);
  }
}

}  // namespace muon::plan
