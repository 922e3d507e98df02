#include "plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "kernels/ns_schedule.hpp"
#include "plan/ns_cost.hpp"
#include "plan/server_placement.hpp"

namespace muon::plan {
namespace {

using topology::Domain;
using topology::Machine;

// Everything that does not depend on the candidate.
struct Context {
  const Machine& machine;
  const PlanRequest& request;
  std::vector<Domain> domains;
  std::vector<std::string> hosts;
  std::vector<ParameterPlan> parameters;  // matrix, flops, cost_s, bytes
  double training_flops = 0;              // per step (0 when step time given)
};

int node_rank_of(const Context& ctx, const std::string& host) {
  return static_cast<int>(std::find(ctx.hosts.begin(), ctx.hosts.end(), host) - ctx.hosts.begin());
}

// Compute seconds of one step on `gpus` compute GPUs.
double compute_seconds(const Context& ctx, int gpus) {
  const int all = static_cast<int>(ctx.machine.gpus.size());
  if (ctx.request.step_time_s > 0) return ctx.request.step_time_s * all / gpus;
  const auto& s = ctx.request.cost;
  return ctx.training_flops / (gpus * s.mfu * s.train_peak_flops);
}

// Servers per domain for a candidate, or empty when infeasible.
std::vector<int> servers_per_domain(const Context& ctx, Placement placement, int k) {
  std::vector<int> out;
  int total = 0;
  for (const auto& d : ctx.domains) {
    const int size = static_cast<int>(d.gpus.size());
    const int kd = placement == Placement::dedicated ? std::min(k, size - 1) : std::min(k, size);
    out.push_back(kd);
    total += kd;
  }
  if (total == 0) return {};
  return out;
}

Plan build_candidate(const Context& ctx, Placement placement, int k,
                     const std::vector<int>& per_domain) {
  const Machine& m = ctx.machine;
  const auto& s = ctx.request.cost;
  Plan plan;
  plan.machine = m;
  plan.hosts = ctx.hosts;
  plan.request = ctx.request;
  plan.training_flops = ctx.training_flops;
  plan.parameters = ctx.parameters;

  // Servers, domain by domain.
  std::vector<int> server_on_gpu(m.gpus.size(), -1);
  for (size_t d = 0; d < ctx.domains.size(); ++d) {
    DomainPlan dp;
    dp.domain = ctx.domains[d];
    dp.link = domain_link(dp.domain.kind);
    dp.link_bw = link_bandwidth(dp.link, m.gpus[dp.domain.gpus.front()], s);
    for (int pos : dp.domain.gpus) {
      const auto& h = m.gpus[pos].host;
      if (std::find(dp.hosts.begin(), dp.hosts.end(), h) == dp.hosts.end()) dp.hosts.push_back(h);
    }
    for (int pos : pick_server_gpus(m, dp.domain, per_domain[d])) {
      Server sv;
      sv.id = static_cast<int>(plan.servers.size());
      sv.gpu = pos;
      sv.gpu_index = m.gpus[pos].index;
      sv.host = m.gpus[pos].host;
      sv.node_rank = node_rank_of(ctx, sv.host);
      sv.domain = static_cast<int>(d);
      sv.numa_node = m.gpus[pos].numa_node;
      sv.socket_name = server_socket_name(sv.gpu_index);
      for (int kind = 0; kind < kLinkKinds; ++kind) {
        sv.load.bandwidth[kind] = link_bandwidth(static_cast<LinkKind>(kind), m.gpus[pos], s);
      }
      server_on_gpu[pos] = sv.id;
      dp.servers.push_back(sv.id);
      plan.servers.push_back(sv);
    }
    plan.domains.push_back(dp);
  }
  std::vector<int> domain_of_gpu(m.gpus.size(), -1);
  for (size_t d = 0; d < ctx.domains.size(); ++d) {
    for (int pos : ctx.domains[d].gpus) domain_of_gpu[pos] = static_cast<int>(d);
  }

  // Compute ranks: hosts in order, GPU index ascending.
  for (const auto& host : ctx.hosts) {
    std::vector<int> positions;
    for (size_t p = 0; p < m.gpus.size(); ++p) {
      if (m.gpus[p].host == host) positions.push_back(static_cast<int>(p));
    }
    std::sort(positions.begin(), positions.end(),
              [&](int a, int b) { return m.gpus[a].index < m.gpus[b].index; });
    int local = 0;
    for (int pos : positions) {
      if (placement == Placement::dedicated && server_on_gpu[pos] >= 0) continue;
      ComputeRank r;
      r.rank = static_cast<int>(plan.ranks.size());
      r.local_rank = local++;
      r.node_rank = node_rank_of(ctx, host);
      r.host = host;
      r.gpu = pos;
      r.gpu_index = m.gpus[pos].index;
      r.domain = domain_of_gpu[pos];
      r.numa_node = m.gpus[pos].numa_node;
      r.colocated_server = server_on_gpu[pos];
      plan.domains[r.domain].compute_ranks.push_back(r.rank);
      plan.ranks.push_back(r);
    }
  }
  for (auto& r : plan.ranks) {
    const auto& own = plan.domains[r.domain].servers;
    if (!own.empty()) {
      r.endpoints = own;
    } else {
      for (const auto& sv : plan.servers) r.endpoints.push_back(sv.id);
    }
  }

  // Ownership: LPT on predicted seconds over the whole pool.
  std::vector<double> costs;
  for (const auto& p : plan.parameters) costs.push_back(p.cost_s);
  plan.lpt = lpt_assign(costs, static_cast<int>(plan.servers.size()));
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    auto& p = plan.parameters[i];
    p.owner = plan.lpt.owner[i];
    Server& o = plan.servers[p.owner];
    o.owns.push_back(static_cast<int>(i));
    o.load.ns_flops += p.flops;
    o.load.ns_s += p.cost_s;
    o.load.momentum_bytes += 4.0 * static_cast<double>(p.matrix.elements());
    if (p.cost_s > o.load.max_job_s) {
      o.load.max_job_s = p.cost_s;
      o.load.max_job_bytes = p.bytes;
    }
  }

  // Paths and bytes. Parameters in LPT order (largest first) so relays balance well.
  std::vector<int> order(plan.parameters.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return plan.parameters[a].cost_s > plan.parameters[b].cost_s;
  });
  std::vector<double> relay_bytes(plan.servers.size(), 0.0);
  auto add = [](Server& sv, LinkKind kind, double in, double out) {
    sv.load.bytes_in[static_cast<int>(kind)] += in;
    sv.load.bytes_out[static_cast<int>(kind)] += out;
  };
  for (int i : order) {
    auto& p = plan.parameters[i];
    Server& owner = plan.servers[p.owner];
    p.relay.assign(plan.domains.size(), -1);
    for (size_t d = 0; d < plan.domains.size(); ++d) {
      const auto& dp = plan.domains[d];
      if (dp.compute_ranks.empty()) continue;
      int target = -1;
      if (static_cast<int>(d) == owner.domain) {
        target = owner.id;
      } else if (!dp.servers.empty()) {
        target = *std::min_element(dp.servers.begin(), dp.servers.end(),
                                   [&](int a, int b) { return relay_bytes[a] < relay_bytes[b]; });
        relay_bytes[target] += p.bytes * static_cast<double>(dp.compute_ranks.size());
        plan.servers[target].relays.push_back(i);
      }
      p.relay[d] = target;
      for (int r : dp.compute_ranks) {
        const auto& rank = plan.ranks[r];
        if (target >= 0) {
          // Within the domain: tiles in, the update back out; nothing crosses a link when the
          // server shares the rank's GPU.
          if (plan.servers[target].gpu != rank.gpu)
            add(plan.servers[target], dp.link, p.bytes, p.bytes);
        } else {
          const LinkKind kind = rank.host == owner.host ? LinkKind::pcie : LinkKind::network;
          add(owner, kind, p.bytes, p.bytes);
        }
      }
      if (target >= 0 && target != owner.id) {
        Server& relay = plan.servers[target];
        const LinkKind kind = relay.host == owner.host ? LinkKind::pcie : LinkKind::network;
        add(relay, kind, p.bytes, p.bytes);  // partial sum out, update in
        add(owner, kind, p.bytes, p.bytes);  // partial sum in, update out
      }
    }
  }
  for (auto& sv : plan.servers) std::sort(sv.relays.begin(), sv.relays.end());

  // Step cost.
  StepCost& c = plan.cost;
  c.placement = placement;
  c.per_domain = k;
  c.servers = static_cast<int>(plan.servers.size());
  c.compute_gpus = static_cast<int>(plan.ranks.size());
  c.compute_all_s = compute_seconds(ctx, static_cast<int>(m.gpus.size()));
  c.compute_s = compute_seconds(ctx, c.compute_gpus);
  c.share_s = c.compute_s - c.compute_all_s;
  c.window_s = s.overlap_fraction * c.compute_s;
  for (auto& sv : plan.servers) {
    const LinkKind intra = plan.domains[sv.domain].link;
    sv.exposed_s = server_exposed_seconds(placement, sv.load, intra, c.window_s, s);
    c.ns_max_s = std::max(c.ns_max_s, sv.load.ns_s);
    c.link_max_s = std::max(c.link_max_s, sv.load.link_s());
    c.exposed_s = std::max(c.exposed_s, sv.exposed_s);
  }
  c.total_s = c.share_s + c.exposed_s;
  return plan;
}

}  // namespace

std::string server_socket_name(int gpu_index) {
  return "muon-offloadd-gpu" + std::to_string(gpu_index) + ".sock";
}

Plan build_plan(const Machine& machine, const ModelConfig& model, const PlanRequest& request,
                const std::string& topology_source) {
  if (machine.gpus.empty()) throw InvalidArgument("the topology has no GPU");
  std::vector<Placement> placements;
  if (request.placement == "auto") {
    placements = {Placement::colocated, Placement::dedicated};
  } else if (request.placement == "dedicated") {
    placements = {Placement::dedicated};
  } else if (request.placement == "colocated") {
    placements = {Placement::colocated};
  } else {
    throw InvalidArgument("unknown placement '" + request.placement +
                          "' (known: dedicated, colocated, auto)");
  }
  if (request.offload_per_domain < 0) {
    throw InvalidArgument("--offload-per-domain must be >= 1 (or auto)");
  }
  if (request.step_time_s <= 0 && !(request.tokens_per_step > 0)) {
    throw InvalidArgument("give --tokens-per-step > 0 or --step-time-ms > 0");
  }
  const auto& s = request.cost;
  if (!(s.gemm_flops > 0) || !(s.gemm_efficiency > 0) || s.gemm_efficiency > 1 || !(s.mfu > 0) ||
      s.mfu > 1 || !(s.train_peak_flops > 0) || !(s.wire_bytes > 0) || s.launch_overhead_s < 0 ||
      s.overlap_fraction < 0 || s.overlap_fraction > 1 || s.colocated_interference < 0) {
    throw InvalidArgument(
        "cost settings out of range (rates > 0, efficiency and MFU in (0, 1], overlap in [0, 1])");
  }
  // Validates the schedule and the step count (throws naming the known schedules).
  PlanRequest req = request;
  req.cost.ns_steps =
      static_cast<int>(find_ns_schedule(s.schedule).coefficients(s.ns_steps).size());

  Context ctx{machine, req, topology::find_domains(machine), topology::host_names(machine), {}, 0};
  if (req.step_time_s <= 0) ctx.training_flops = training_flops(model, req.tokens_per_step);
  for (const auto& mat : model.muon) {
    ParameterPlan p;
    p.matrix = mat;
    p.flops = ns_run_flops(mat, req.cost.ns_steps, req.cost.algorithm);
    p.cost_s = parameter_seconds(mat, req.cost);
    p.bytes = static_cast<double>(mat.elements()) * req.cost.wire_bytes;
    ctx.parameters.push_back(std::move(p));
  }

  int max_size = 0;
  for (const auto& d : ctx.domains) max_size = std::max(max_size, static_cast<int>(d.gpus.size()));
  std::vector<Plan> candidates;
  for (Placement placement : placements) {
    const int k_hi = placement == Placement::dedicated ? max_size - 1 : max_size;
    if (request.offload_per_domain > 0 && request.offload_per_domain > max_size) {
      throw InvalidArgument("--offload-per-domain " + std::to_string(request.offload_per_domain) +
                            " exceeds the largest domain (" + std::to_string(max_size) + " GPUs)");
    }
    const int lo = request.offload_per_domain > 0 ? request.offload_per_domain : 1;
    const int hi = request.offload_per_domain > 0 ? request.offload_per_domain : k_hi;
    std::vector<int> previous;
    for (int k = lo; k <= hi; ++k) {
      auto per_domain = servers_per_domain(ctx, placement, k);
      if (per_domain.empty() || per_domain == previous) continue;
      previous = per_domain;
      candidates.push_back(build_candidate(ctx, placement, k, per_domain));
    }
  }
  if (candidates.empty()) {
    throw InvalidArgument(
        "no feasible plan: dedicated servers need a domain of 2 or more GPUs (one must compute); "
        "try --placement colocated");
  }
  double best = candidates.front().cost.total_s;
  for (const auto& c : candidates) best = std::min(best, c.cost.total_s);
  const double slack = std::max(0.01 * best, 1e-3);
  size_t chosen = candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].cost.total_s > best + slack) continue;
    if (chosen == candidates.size()) {
      chosen = i;
      continue;
    }
    const auto& a = candidates[i].cost;
    const auto& b = candidates[chosen].cost;
    if (a.servers < b.servers || (a.servers == b.servers && a.placement == Placement::colocated &&
                                  b.placement == Placement::dedicated)) {
      chosen = i;
    }
  }
  Plan plan = std::move(candidates[chosen]);
  for (const auto& c : candidates) plan.candidates.push_back(c.cost);
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const StepCost& a, const StepCost& b) { return a.total_s < b.total_s; });
  plan.model_name = model.name;
  plan.muon_params = model.muon_params();
  plan.total_params = model.total_params();
  plan.topology_source = topology_source;
  plan.placement_auto = request.placement == "auto";
  plan.per_domain_auto = request.offload_per_domain == 0;
  return plan;
}

}  // namespace muon::plan
