#include "cli/plan_command.hpp"

#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "cli/number_checks.hpp"
#include "core/error.hpp"
#include "plan/model_config.hpp"
#include "plan/plan.hpp"
#include "plan/plan_json.hpp"
#include "plan/plan_table.hpp"
#include "topology/topology_json.hpp"
#include "topology/topology_source.hpp"

namespace muon::cli {
namespace {

struct PlanArgs {
  std::string topology;
  std::string model;
  int nodes = 0;
  std::string placement = "auto";
  std::string per_domain = "auto";
  double tokens_per_step = 1e6;
  double step_time_ms = 0;
  double gemm_tflops = 0;
  std::string gpu_model;
  std::string ns_precision = "bf16";
  double gpu_memory_gb = 0;
  std::string client_mode = "server_reduce";
  double colocated_memory_share = 0.25;
  std::string memory_check = "refuse";
  double auto_tolerance = 0.01;
  double auto_tolerance_ms = 1.0;
  double gemm_efficiency = 0.70;
  double launch_overhead_us = 5;
  std::string schedule = "keller";
  int steps = 0;
  std::string algorithm = "syrk";
  double mfu = 0.40;
  double train_peak_tflops = 0;
  double nvlink_gbs = 25;
  double fabric_gbs = 50;
  double pcie_gbs = 25;
  double network_gbs = 50;
  std::string wire_dtype = "f32";
  double overlap_fraction = 2.0 / 3.0;
  double colocated_interference = 1.0;
  std::string socket_dir;
  std::string output;
  std::string save_topology;
};

void run_plan(const PlanArgs& a) {
  plan::PlanRequest req;
  req.placement = a.placement;
  if (a.per_domain != "auto") {
    try {
      size_t used = 0;
      req.offload_per_domain = std::stoi(a.per_domain, &used);
      if (used != a.per_domain.size() || req.offload_per_domain < 1) throw std::exception();
    } catch (const std::exception&) {
      throw InvalidArgument("--offload-per-domain: expected a count >= 1 or auto, got '" +
                            a.per_domain + "'");
    }
  }
  req.tokens_per_step = a.tokens_per_step;
  req.step_time_s = a.step_time_ms / 1000.0;
  req.socket_dir = a.socket_dir;
  auto& c = req.cost;
  c.schedule = a.schedule;
  c.ns_steps = a.steps;
  c.algorithm = parse_ns_algorithm(a.algorithm);
  req.gpu_model = a.gpu_model;
  req.gemm_flops = a.gemm_tflops * 1e12;
  req.train_peak_flops = a.train_peak_tflops * 1e12;
  req.gpu_memory_bytes = a.gpu_memory_gb * 1e9;
  c.ns_precision = parse_precision(a.ns_precision);
  req.memory.client_mode = plan::parse_client_mode(a.client_mode);
  req.memory.colocated_share = a.colocated_memory_share;
  req.memory.refuse = a.memory_check == "refuse";
  req.auto_tolerance = a.auto_tolerance;
  req.auto_tolerance_s = a.auto_tolerance_ms * 1e-3;
  c.gemm_efficiency = a.gemm_efficiency;
  c.launch_overhead_s = a.launch_overhead_us * 1e-6;
  c.mfu = a.mfu;
  c.nvlink_link_bw = a.nvlink_gbs * 1e9;
  c.fabric_link_bw = a.fabric_gbs * 1e9;
  c.pcie_bw = a.pcie_gbs * 1e9;
  c.network_bw = a.network_gbs * 1e9;
  c.wire_bytes = a.wire_dtype == "bf16" ? 2 : 4;
  c.overlap_fraction = a.overlap_fraction;
  c.colocated_interference = a.colocated_interference;

  const auto loaded = topology::load_topology(a.topology);
  const auto machine = topology::job_machine(loaded.machine, a.nodes);
  if (!a.save_topology.empty()) {
    std::ofstream f(a.save_topology, std::ios::trunc);
    f << topology::write_topology_json(machine);
    f.flush();
    if (!f) throw Error("cannot write the topology to '" + a.save_topology + "'");
  }
  const auto model = plan::load_model_config(a.model);
  const auto p = plan::build_plan(machine, model, req, loaded.source);
  plan::print_plan_table(p, std::cout);
  if (!a.output.empty()) {
    std::ofstream f(a.output, std::ios::trunc);
    f << plan::write_plan_json(p);
    f.flush();
    if (!f) throw Error("cannot write the plan to '" + a.output + "'");
    std::cout << "\nplan written to " << a.output << '\n';
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Plan the offload servers of a job: per NVLink domain the serving and computing GPUs, the\n"
      "owner server of every Muon parameter (LPT on predicted cost), reduction and broadcast\n"
      "paths, each rank's server endpoints, NUMA binding; picks placement and servers per\n"
      "domain by predicted cost. Prints a table; --output writes the plan JSON.");
  sub->add_option("--topology", a->topology,
                  "auto (live discovery through NVML on this host), or a file: a JSON description "
                  "(muon-offload-topology/1) or the text of `nvidia-smi topo -m`")
      ->required();
  sub->add_option("--model", a->model,
                  "Model config (muon-offload-model/1), e.g. configs/models/llama3_8b.json")
      ->required();
  sub->add_option("--nodes", a->nodes,
                  "Hosts in the job: a one-host topology is replicated N times, a multi-host one "
                  "keeps its first N (0: as described)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  sub->add_option("--placement", a->placement,
                  "dedicated (servers on GPUs of their own), colocated (sharing compute ranks' "
                  "GPUs) or auto (the lower predicted cost)")
      ->check(CLI::IsMember({"dedicated", "colocated", "auto"}))
      ->capture_default_str();
  sub->add_option("--offload-per-domain", a->per_domain,
                  "Servers per NVLink domain, or auto (the lowest predicted cost)")
      ->capture_default_str();
  auto* tokens = sub->add_option("--tokens-per-step", a->tokens_per_step,
                                 "Training tokens per step (step time = 6 x active params x "
                                 "tokens / (GPUs x MFU x peak))")
                     ->check(finite_positive())
                     ->capture_default_str();
  auto* step = sub->add_option("--step-time-ms", a->step_time_ms,
                               "Measured step time with every GPU training, instead of tokens")
                   ->check(finite_positive());
  tokens->excludes(step);
  step->excludes(tokens);
  sub->add_option("--gpu-model", a->gpu_model,
                  "GPU model the rates and memory come from: a100, h100, h100_pcie, h200, b200, "
                  "gb200 (default: from the topology: its device names, else its links)");
  sub->add_option("--ns-precision", a->ns_precision,
                  "Precision of the server's Newton-Schulz products: bf16 (tensor cores) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  sub->add_option("--gemm-tflops", a->gemm_tflops,
                  "GEMM rate of a server GPU, TFLOP/s (default: 80 % of the GPU model's dense "
                  "peak at --ns-precision; or measured by bench/ with --gemm-efficiency 1)")
      ->check(finite_positive());
  sub->add_option("--gpu-memory-gb", a->gpu_memory_gb,
                  "Memory of one GPU, GB (default: the topology's, else the GPU model's)")
      ->check(finite_positive());
  sub->add_option("--client-mode", a->client_mode,
                  "How ranks push gradients (OffloadMuon's mode): server_reduce (each rank its "
                  "whole gradient; the server keeps one buffer per rank) or shard (1/world each)")
      ->check(CLI::IsMember({"server_reduce", "shard"}))
      ->capture_default_str();
  sub->add_option("--colocated-memory-share", a->colocated_memory_share,
                  "Share of its GPU's memory a co-located server may use (the trainer keeps the "
                  "rest)")
      ->check(finite_range(0.01, 1.0))
      ->capture_default_str();
  sub->add_option("--memory-check", a->memory_check,
                  "refuse: a plan whose servers do not fit in GPU memory is an error (auto "
                  "prefers candidates that fit); warn: print it with a warning")
      ->check(CLI::IsMember({"refuse", "warn"}))
      ->capture_default_str();
  sub->add_option("--auto-tolerance", a->auto_tolerance,
                  "auto: candidates within this fraction of the cheapest total (or "
                  "--auto-tolerance-ms) count as equal; the fewest servers among them wins")
      ->check(finite_range(0.0, 10.0))
      ->capture_default_str();
  sub->add_option("--auto-tolerance-ms", a->auto_tolerance_ms,
                  "auto: the same tolerance in milliseconds (the larger of the two applies)")
      ->check(finite_range(0.0, 1e9))
      ->capture_default_str();
  sub->add_option("--gemm-efficiency", a->gemm_efficiency,
                  "Fraction of the GEMM rate Newton-Schulz reaches")
      ->check(finite_range(0.001, 1.0))
      ->capture_default_str();
  sub->add_option("--launch-overhead-us", a->launch_overhead_us,
                  "Per GEMM launch, microseconds (3 launches per Newton-Schulz step)")
      ->check(finite_range(0.0, 1e6))
      ->capture_default_str();
  sub->add_option("--schedule", a->schedule,
                  "Newton-Schulz schedule (see `muon-offload schedules`)")
      ->capture_default_str();
  sub->add_option("--steps", a->steps, "Newton-Schulz steps; 0: the schedule's default")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  sub->add_option("--algorithm", a->algorithm,
                  "How the products are counted: plain (4 m^2 n + 2 m^3 per step), syrk "
                  "(3 m^2 n + m^3), gram")
      ->check(CLI::IsMember({"plain", "syrk", "gram"}))
      ->capture_default_str();
  sub->add_option("--mfu", a->mfu, "Model FLOPs utilization of training")
      ->check(finite_range(0.001, 1.0))
      ->capture_default_str();
  sub->add_option("--train-peak-tflops", a->train_peak_tflops,
                  "Peak TFLOP/s of a compute GPU that MFU refers to (default: the GPU model's "
                  "dense bf16 peak, e.g. 989 on H100/H200 SXM)")
      ->check(finite_positive());
  sub->add_option("--nvlink-gbs-per-link", a->nvlink_gbs,
                  "GB/s per NVLink link and direction (NVLink 3/4)")
      ->check(finite_positive())
      ->capture_default_str();
  sub->add_option("--fabric-gbs-per-link", a->fabric_gbs,
                  "GB/s per NVLink 5 link and direction (NVL72 fabric domains)")
      ->check(finite_positive())
      ->capture_default_str();
  sub->add_option("--pcie-gbs", a->pcie_gbs, "GB/s per GPU and direction over PCIe")
      ->check(finite_positive())
      ->capture_default_str();
  sub->add_option("--network-gbs", a->network_gbs, "GB/s per GPU and direction across hosts")
      ->check(finite_positive())
      ->capture_default_str();
  sub->add_option("--wire-dtype", a->wire_dtype, "Gradient and update elements on the wire")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  sub->add_option("--overlap-fraction", a->overlap_fraction,
                  "Share of the compute step a dedicated server's work can hide behind")
      ->check(finite_range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--colocated-interference", a->colocated_interference,
                  "Share of a co-located server's NS time its GPU's compute rank loses")
      ->check(finite_range(0.0, 10.0))
      ->capture_default_str();
  sub->add_option("--socket-dir", a->socket_dir,
                  "Directory of the server sockets written into the plan (default: the daemon's, "
                  "$XDG_RUNTIME_DIR/muon-offload or /tmp/muon-offload-<uid>)");
  sub->add_option("-o,--output", a->output, "Write the plan JSON (muon-offload-plan/1) here");
  sub->add_option("--save-topology", a->save_topology,
                  "Also write the job's machine as a JSON description (muon-offload-topology/1), "
                  "e.g. to keep what `--topology auto` discovered");
  sub->callback([a] { run_plan(*a); });
}

}  // namespace muon::cli
