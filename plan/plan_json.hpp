// The plan file, schema "muon-offload-plan/1": what `muon-offload plan --output` writes and what
// scripts/muon-offload-launch reads. Top-level keys:
//   schema, model, topology, placement, offload_per_domain, chosen_by, settings, socket_dir,
//   paths      the reduction and broadcast rule in words (plan/plan.hpp)
//   domains    per domain: kind, hosts, GPUs, link and its bytes/s, server ids, compute ranks
//   nodes      per host (node_rank order): its servers (GPU, CUDA_VISIBLE_DEVICES, socket name,
//              NUMA node, numactl arguments, parameters owned) and its compute GPUs
//              (CUDA_VISIBLE_DEVICES, nproc, global ranks): everything a per-node launcher needs
//   servers    per server: host, GPU, domain, socket name, NUMA binding, the parameters it owns
//              and relays, its predicted load (FLOPs, seconds, bytes per link kind)
//   ranks      per compute rank: host, local rank, GPU, NUMA binding, server endpoints
//   parameters per Muon parameter: shape, owner, relay per domain (null: straight to the owner),
//              FLOPs, predicted seconds, bytes
//   cost, lpt, candidates   the step cost of the chosen plan, the LPT balance and its bounds,
//              and every candidate costed
// Units: seconds (_s), bytes, FLOP, FLOP/s, bytes/s (_bytes_per_s).
#pragma once

#include <string>

#include "plan/plan.hpp"

namespace muon::plan {

inline constexpr std::string_view kPlanSchema = "muon-offload-plan/1";

/// The plan as a muon-offload-plan/1 document (2-space indent, trailing newline).
std::string write_plan_json(const Plan& plan);

/// "--cpunodebind=N --membind=N", or "" when the NUMA node is unknown.
std::string numactl_args(int numa_node);

}  // namespace muon::plan
