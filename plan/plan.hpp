// The offload plan: which GPUs serve and which compute, per domain; which server owns each
// parameter across the whole job (one pool); the reduction path from compute ranks to owners
// and the broadcast path back; each compute rank's server endpoints; NUMA binding; and the
// predicted cost of all of it (architecture guide, sections 1 and 6).
//
// Paths. For a parameter p owned by server o (in domain D):
//   reduce     the compute ranks of each domain d push p's gradient tiles to relay(p, d), a server
//              of d (o itself in D), over d's link (NVLink, fabric NVLink, or PCIe); the relay sums
//              its domain's contributions (contributor order) and forwards one partial sum to o,
//              over the network (or PCIe when relay and owner share a host). A domain without a
//              server pushes straight to o.
//   broadcast  the reverse: o sends the update to each relay, each relay to its domain's ranks.
// Relays are chosen per parameter and domain to balance the bytes each server forwards.
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.hpp"
#include "plan/gpu_model.hpp"
#include "plan/lpt.hpp"
#include "plan/model_config.hpp"
#include "plan/server_memory.hpp"
#include "topology/domains.hpp"
#include "topology/machine.hpp"

namespace muon::plan {

/// What the user asks for (`muon-offload plan` flags).
struct PlanRequest {
  /// "dedicated", "colocated" or "auto" (the cheaper total, see Plan::candidates).
  std::string placement = "auto";
  /// Servers per domain; 0: auto (every feasible count is costed, the cheapest kept).
  int offload_per_domain = 0;
  /// Training tokens per step; used when step_time_s is 0. Default 1M (architecture guide).
  double tokens_per_step = 1e6;
  /// Measured step time with every GPU training, seconds; 0: derive from tokens_per_step.
  double step_time_s = 0;
  /// The GPU model ("h100", plan/gpu_model.hpp); empty: identified from the topology.
  std::string gpu_model;
  /// Rates and memory that replace the GPU model's when > 0: the server's GEMM rate (FLOP/s),
  /// the compute GPU's peak that MFU refers to (FLOP/s), the GPU's memory (bytes).
  double gemm_flops = 0;
  double train_peak_flops = 0;
  double gpu_memory_bytes = 0;
  /// Settings of the cost model; build_plan fills gemm_flops and train_peak_flops from the GPU
  /// model (or the overrides above), so values set here are replaced.
  CostSettings cost;
  MemorySettings memory;
  /// The auto rule: among the candidates that fit in memory, those within
  /// max(auto_tolerance x cheapest, auto_tolerance_s) of the cheapest total go to the fewest
  /// servers, then to co-location (no GPU given up). 0 and 0: strictly the cheapest.
  double auto_tolerance = 0.01;
  double auto_tolerance_s = 1e-3;
  /// Directory of the server sockets; empty: the daemon's default
  /// ($XDG_RUNTIME_DIR/muon-offload, else /tmp/muon-offload-<uid>).
  std::string socket_dir;
};

/// One offload server (one muon-offloadd process).
struct Server {
  int id = 0;
  int gpu = 0;        ///< position in Machine::gpus
  int gpu_index = 0;  ///< index on its host (CUDA_VISIBLE_DEVICES)
  std::string host;
  int node_rank = 0;  ///< position of its host in the job's host list
  int domain = 0;
  int numa_node = -1;
  std::string socket_name;  ///< "muon-offloadd-gpu7.sock", unique per host
  std::vector<int> owns;    ///< parameter indices (into Plan::parameters) it owns
  std::vector<int> relays;  ///< parameter indices it relays for its domain (owner elsewhere)
  /// The server that keeps a replica of the state of every parameter this one owns (the
  /// owner streams each applied step's momentum and update to it, daemon/pool/replicator.hpp) and
  /// takes them over when this one is lost; -1: none (an owner of nothing, or no server of the
  /// pool qualifies: a buddy must not relay any of this server's parameters). The least loaded
  /// qualifying server by momentum bytes already buddied, on another host first.
  int buddy = -1;
  ServerLoad load;
  ServerMemory memory;
  double exposed_s = 0;
};

/// One compute rank (a trainer process).
struct ComputeRank {
  int rank = 0;  ///< global rank in the plan's order: hosts in order, GPU index ascending
  int local_rank = 0;
  int node_rank = 0;
  std::string host;
  int gpu = 0;  ///< position in Machine::gpus
  int gpu_index = 0;
  int domain = 0;
  int numa_node = -1;
  int colocated_server = -1;   ///< the server sharing its GPU, or -1
  std::vector<int> endpoints;  ///< server ids it talks to (its domain's servers, ascending)
};

struct DomainPlan {
  topology::Domain domain;
  LinkKind link = LinkKind::nvlink;
  double link_bw = 0;        ///< bytes/s per GPU and direction on `link` (first GPU of the domain)
  std::vector<int> servers;  ///< server ids
  std::vector<int> compute_ranks;  ///< ranks
  std::vector<std::string> hosts;
};

struct ParameterPlan {
  MuonMatrix matrix;
  double flops = 0;   ///< Newton-Schulz FLOPs per step
  double cost_s = 0;  ///< predicted seconds on its owner (parameter_seconds)
  double bytes = 0;   ///< elements x wire bytes
  int owner = -1;
  std::vector<int> relay;  ///< per domain: the server its ranks push to, or -1 (straight to owner)
};

/// Cost of one (placement, servers per domain) choice, per training step.
struct StepCost {
  Placement placement = Placement::dedicated;
  int per_domain = 0;  ///< requested servers per domain
  int servers = 0;     ///< total servers after clamping to domain sizes
  int compute_gpus = 0;
  double compute_all_s = 0;        ///< compute time with every GPU training
  double compute_s = 0;            ///< compute time on this choice's compute GPUs
  double share_s = 0;              ///< compute_s - compute_all_s: the GPUs dedicated servers take
  double window_s = 0;             ///< overlap window: overlap_fraction x compute_s
  double ns_max_s = 0;             ///< busiest server's Newton-Schulz seconds
  double link_max_s = 0;           ///< busiest server's link seconds
  double exposed_s = 0;            ///< max over servers of server_exposed_seconds
  double total_s = 0;              ///< share_s + exposed_s: the step's cost of the optimizer
  double memory_max_bytes = 0;     ///< the most memory one server needs (ServerMemory::total)
  double memory_budget_bytes = 0;  ///< what one server may use; 0: unknown
  bool fits = true;     ///< every server within its memory budget (or the budget unknown)
  bool chosen = false;  ///< the candidate the plan is (Plan::candidates)
};

struct Plan {
  std::string model_name;
  int64_t muon_params = 0;
  int64_t total_params = 0;
  std::string topology_source;
  topology::Machine machine;
  std::vector<std::string> hosts;
  PlanRequest request;
  bool placement_auto = false;
  bool per_domain_auto = false;
  double training_flops = 0;  ///< per step; 0 when the step time was given
  GpuIdentity gpu;            ///< the GPU model the rates and memory come from
  std::vector<DomainPlan> domains;
  std::vector<Server> servers;
  std::vector<ComputeRank> ranks;
  std::vector<ParameterPlan> parameters;
  LptResult lpt;
  StepCost cost;                     ///< the chosen candidate
  std::vector<StepCost> candidates;  ///< every candidate costed (auto), cheapest first
  /// What the reader must know: servers near or over their memory budget (when not refused),
  /// a domain given fewer servers than asked.
  std::vector<std::string> warnings;
};

/// Builds the plan. Rates and memory come from the GPU model (identify_gpus: request.gpu_model,
/// else the topology) unless the request overrides them. With placement "auto" and/or
/// offload_per_domain 0, costs every feasible (placement, k) — dedicated needs one compute GPU
/// left in each domain that has a server, and k is clamped to each smaller domain's size — and
/// applies the auto rule (PlanRequest::auto_tolerance) to those that fit in memory.
/// Throws InvalidArgument for an unknown placement or GPU model, no feasible candidate
/// (dedicated on a machine of one-GPU domains), k out of range (more servers than the largest
/// domain has GPUs, or dedicated servers on all of them), a bad schedule/steps, or — unless
/// request.memory.refuse is false or the GPU model was assumed — no candidate whose servers fit
/// in memory (the message names the server, what it needs and its budget).
Plan build_plan(const topology::Machine& machine, const ModelConfig& model,
                const PlanRequest& request, const std::string& topology_source = "");

/// "muon-offloadd-gpu<index>.sock".
std::string server_socket_name(int gpu_index);

}  // namespace muon::plan
