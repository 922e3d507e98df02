#include "plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/error.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/step_batch.hpp"
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

// Each owner's buddy (Server::buddy): a server that relays none of its parameters (at a
// takeover the buddy becomes their owner with the owner's registrants: a server that relays one
// of them for its domain would have to be both), on another host when one qualifies (a host
// lost takes the owner, not its replicas), the least loaded by momentum bytes already buddied,
// then the lowest id.
void choose_buddies(Plan& plan) {
  std::vector<double> kept(plan.servers.size(), 0.0);
  for (auto& owner : plan.servers) {
    if (owner.owns.empty()) continue;
    double bytes = 0;
    std::vector<bool> relays_one(plan.servers.size(), false);
    for (int i : owner.owns) {
      const auto& p = plan.parameters[i];
      bytes += static_cast<double>(p.matrix.elements()) * 4.0;
      for (int r : p.relay) {
        if (r >= 0) relays_one[r] = true;
      }
    }
    int best = -1;
    for (const auto& sv : plan.servers) {
      if (sv.id == owner.id || relays_one[sv.id]) continue;
      if (best < 0) {
        best = sv.id;
        continue;
      }
      const auto& b = plan.servers[best];
      const bool other_host = sv.host != owner.host, best_other = b.host != owner.host;
      if (other_host != best_other) {
        if (other_host) best = sv.id;
        continue;
      }
      if (kept[sv.id] < kept[best]) best = sv.id;
    }
    owner.buddy = best;
    if (best >= 0) kept[best] += bytes;
  }
}

// The step runner's scratch and Newton-Schulz workspace on each server (plan/server_memory.hpp):
// its owned parameters grouped by the matrix Newton-Schulz sees, the largest batch the
// scheduler can form from one group (at most kMaxBatchElements, kernels/step_batch.hpp), and the
// largest single parameter.
void add_step_scratch(Plan& plan, Precision precision) {
  struct Group {
    double elements = 0;
    int members = 0;
  };
  std::vector<std::map<std::pair<int64_t, int64_t>, Group>> groups(plan.servers.size());
  std::vector<double> largest(plan.servers.size(), 0);
  for (const auto& p : plan.parameters) {
    const MuonMatrix& m = p.matrix;
    Group& g = groups[p.owner][{m.rows / m.row_blocks, m.cols}];
    g.elements += static_cast<double>(m.elements());
    ++g.members;
    largest[p.owner] = std::max(largest[p.owner], static_cast<double>(m.elements()));
    Server& owner = plan.servers[p.owner];
    owner.memory.workspace = std::max(owner.memory.workspace, ns_workspace_bytes(m, precision));
  }
  const double cap = static_cast<double>(kMaxBatchElements);
  for (auto& sv : plan.servers) {
    double batch = 0;  // elements of the largest batch of two or more parameters
    for (const auto& [shape, g] : groups[sv.id]) {
      if (g.members < 2) continue;
      const double elements = std::min(g.elements, cap);
      batch = std::max(batch, elements);
      const MuonMatrix batched{"batch", shape.first, shape.second,
                               static_cast<int64_t>(elements) / (shape.first * shape.second), 1,
                               false};
      sv.memory.workspace = std::max(sv.memory.workspace, ns_workspace_bytes(batched, precision));
    }
    // The momenta of a call (a lone parameter's copy, or a batch's), and a batch's gradients
    // and updates: each scratch buffer stays at the largest it was.
    sv.memory.scratch = 4 * std::max(largest[sv.id], batch) + 8 * batch;
  }
}

// Fills each server's ServerMemory (plan/server_memory.hpp) from its owned and relayed
// parameters, the contributors of each and the sessions the plan opens to it.
void add_memory(Plan& plan, Placement placement, const MemorySettings& ms, Precision precision) {
  const double world = static_cast<double>(std::max<size_t>(plan.ranks.size(), 1));
  const bool shard = ms.client_mode == ClientMode::shard;
  std::vector<int> sessions(plan.servers.size(), 0);
  for (const auto& r : plan.ranks) {
    for (int e : r.endpoints) ++sessions[e];
  }
  std::vector<std::vector<bool>> relays_to(plan.servers.size(),
                                           std::vector<bool>(plan.servers.size(), false));
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const auto& p = plan.parameters[i];
    const double n = static_cast<double>(p.matrix.elements());
    Server& owner = plan.servers[p.owner];
    owner.memory.momentum += 4 * n;
    owner.memory.buffers += 8 * n;
    for (size_t d = 0; d < plan.domains.size(); ++d) {
      const auto& ranks = plan.domains[d].compute_ranks;
      if (ranks.empty()) continue;
      const double per_rank = shard ? n / world : n;
      const int target = p.relay[d] >= 0 ? p.relay[d] : p.owner;
      plan.servers[target].memory.contributions += 4 * per_rank * static_cast<double>(ranks.size());
      if (target != p.owner) {  // a relay: its buffers, and one partial sum at the owner
        plan.servers[target].memory.buffers += 8 * n;
        owner.memory.contributions +=
            4 * (shard ? n * static_cast<double>(ranks.size()) / world : n);
        relays_to[p.owner][target] = true;
      }
    }
  }
  add_step_scratch(plan, precision);
  for (auto& sv : plan.servers) {
    int relay_sessions = 0;
    for (bool b : relays_to[sv.id]) relay_sessions += b ? 1 : 0;
    sv.memory.rings = static_cast<double>(sessions[sv.id] + relay_sessions) *
                      (ms.tx_slots + ms.rx_slots) * ms.slot_bytes;
    sv.memory.context = ms.context_bytes;
    if (ms.gpu_memory_bytes > 0) {
      sv.memory.budget = placement == Placement::colocated
                             ? ms.colocated_share * ms.gpu_memory_bytes
                             : ms.gpu_memory_bytes;
    }
  }
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
  choose_buddies(plan);
  add_memory(plan, placement, ctx.request.memory, s.ns_precision);

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
  for (const auto& sv : plan.servers) {
    c.memory_max_bytes = std::max(c.memory_max_bytes, sv.memory.total());
    c.memory_budget_bytes = sv.memory.budget;
    c.fits = c.fits && sv.memory.fits();
  }
  return plan;
}

// "95.3 GB (momentum 14.0, gradient and update 28.0, step scratch 1.2, ...)" of one server.
std::string memory_text(const ServerMemory& m) {
  auto gb = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", b / 1e9);
    return std::string(buf);
  };
  return gb(m.total()) + " GB (momentum " + gb(m.momentum) + ", gradient and update " +
         gb(m.buffers) + ", step scratch " + gb(m.scratch) + ", per-contributor buffers " +
         gb(m.contributions) + ", rings " + gb(m.rings) + ", Newton-Schulz workspace " +
         gb(m.workspace) + ", CUDA context " + gb(m.context) + ")";
}

// The server of `plan` furthest over (or nearest to) its budget.
const Server& tightest_server(const Plan& plan) {
  const Server* worst = &plan.servers.front();
  for (const auto& sv : plan.servers) {
    if (sv.memory.total() - sv.memory.budget > worst->memory.total() - worst->memory.budget) {
      worst = &sv;
    }
  }
  return *worst;
}

std::string server_text(const Server& sv) {
  return "server " + std::to_string(sv.id) + " (" + sv.host + " GPU" +
         std::to_string(sv.gpu_index) + ")";
}

std::string budget_text(const Plan& plan, Placement placement) {
  char buf[160];
  const double gpu = plan.request.memory.gpu_memory_bytes;
  if (placement == Placement::colocated) {
    std::snprintf(buf, sizeof buf,
                  "%.1f GB (%.0f %% of the GPU's %.0f GB; the trainer keeps the rest)",
                  plan.request.memory.colocated_share * gpu / 1e9,
                  100 * plan.request.memory.colocated_share, gpu / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GB (the whole GPU)", gpu / 1e9);
  }
  return buf;
}

// What a plan that does not fit can change.
std::string memory_advice(const PlanRequest& req) {
  std::string a = "more servers per domain (--offload-per-domain), more nodes (--nodes)";
  if (req.memory.client_mode == ClientMode::server_reduce) {
    a = "OffloadMuon(mode=\"shard\") with --client-mode shard (each rank then pushes 1/world of "
        "every gradient, not all of it), " +
        a;
  }
  return a + ", or a larger --colocated-memory-share";
}

// "3 servers (0, 1, 2)" / "server 4 (node0 GPU4)".
std::string servers_text(const Plan& plan, const std::vector<int>& ids) {
  if (ids.size() == 1) return server_text(plan.servers[ids.front()]);
  std::string list;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > 8) list += ", ...";
  return std::to_string(ids.size()) + " servers (" + list + ")";
}

// Servers near or over their budget (when the plan was not refused), cheaper candidates passed
// over for memory, domains given fewer servers than asked.
void add_warnings(Plan& plan) {
  const auto& ms = plan.request.memory;
  std::vector<int> over, tight;
  for (const auto& sv : plan.servers) {
    if (sv.memory.budget <= 0) continue;
    const double need = sv.memory.total();
    if (need > sv.memory.budget) {
      over.push_back(sv.id);
    } else if (need > ms.warn_share * sv.memory.budget) {
      tight.push_back(sv.id);
    }
  }
  const std::string budget = budget_text(plan, plan.cost.placement);
  auto worst_of = [&](const std::vector<int>& ids) -> const Server& {
    const Server* w = &plan.servers[ids.front()];
    for (int id : ids) {
      if (plan.servers[id].memory.total() > w->memory.total()) w = &plan.servers[id];
    }
    return *w;
  };
  if (!over.empty()) {
    const Server& w = worst_of(over);
    plan.warnings.push_back(servers_text(plan, over) + " need more than their " + budget +
                            "; the most, " + server_text(w) + ": " + memory_text(w.memory) +
                            (plan.gpu.source == GpuModelSource::assumed
                                 ? "; the GPU model was assumed: pass --gpu-model"
                                 : "; they will not start. Try " + memory_advice(plan.request)));
  }
  if (!tight.empty()) {
    const Server& w = worst_of(tight);
    char share[32];
    std::snprintf(share, sizeof share, "%.0f %%", 100 * w.memory.total() / w.memory.budget);
    plan.warnings.push_back(servers_text(plan, tight) + " need up to " + share + " of their " +
                            budget + " (fragmentation or a larger trainer may fail them); " +
                            server_text(w) + ": " + memory_text(w.memory));
  }
  if (plan.cost.fits) {
    for (const auto& c : plan.candidates) {
      if (c.fits || c.total_s >= plan.cost.total_s) continue;
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "cheaper candidates do not fit in memory (the cheapest: %s with %d per domain, "
                    "%.4g s, needs %.1f GB of %.1f GB per server); ",
                    placement_name(c.placement), c.per_domain, c.total_s, c.memory_max_bytes / 1e9,
                    c.memory_budget_bytes / 1e9);
      plan.warnings.push_back(buf + std::string("to make one fit, try ") +
                              memory_advice(plan.request));
      break;  // candidates are cheapest first
    }
  }
  for (size_t d = 0; d < plan.domains.size(); ++d) {
    const auto& dp = plan.domains[d];
    const int got = static_cast<int>(dp.servers.size());
    if (got < plan.cost.per_domain && !dp.compute_ranks.empty()) {
      plan.warnings.push_back("domain " + std::to_string(d) + " (" + dp.domain.label + ", " +
                              std::to_string(dp.domain.gpus.size()) + " GPUs) gets " +
                              std::to_string(got) + " server(s), not " +
                              std::to_string(plan.cost.per_domain) +
                              ": it has no more GPUs to give");
    }
  }
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
  // Validates the schedule and the step count (throws naming the known schedules).
  PlanRequest req = request;
  req.cost.ns_steps = static_cast<int>(
      find_ns_schedule(request.cost.schedule).coefficients(request.cost.ns_steps).size());
  // Rates and memory from the GPU model, unless given.
  const GpuIdentity gpu = identify_gpus(machine, request.gpu_model);
  if (req.cost.ns_precision != Precision::bf16 && req.cost.ns_precision != Precision::fp32) {
    throw InvalidArgument("the Newton-Schulz precision of a plan is bf16 or fp32");
  }
  const double peak =
      req.cost.ns_precision == Precision::fp32 ? gpu.model.fp32_flops : gpu.model.bf16_flops;
  req.cost.gemm_flops = request.gemm_flops > 0 ? request.gemm_flops : kGemmFractionOfPeak * peak;
  req.cost.train_peak_flops =
      request.train_peak_flops > 0 ? request.train_peak_flops : gpu.model.bf16_flops;
  req.memory.gpu_memory_bytes =
      request.gpu_memory_bytes > 0 ? request.gpu_memory_bytes : gpu.model.memory_bytes;
  const auto& s = req.cost;
  if (!(s.gemm_flops > 0) || !(s.gemm_efficiency > 0) || s.gemm_efficiency > 1 || !(s.mfu > 0) ||
      s.mfu > 1 || !(s.train_peak_flops > 0) || !(s.wire_bytes > 0) || s.launch_overhead_s < 0 ||
      s.overlap_fraction < 0 || s.overlap_fraction > 1 || s.colocated_interference < 0) {
    throw InvalidArgument(
        "cost settings out of range (rates > 0, efficiency and MFU in (0, 1], overlap in [0, 1])");
  }
  const auto& ms = req.memory;
  if (!(ms.colocated_share > 0) || ms.colocated_share > 1 || !(ms.warn_share > 0) ||
      ms.warn_share > 1 || ms.gpu_memory_bytes < 0) {
    throw InvalidArgument(
        "memory settings out of range (--colocated-memory-share in (0, 1], GPU memory >= 0)");
  }
  if (!(req.auto_tolerance >= 0) || !(req.auto_tolerance_s >= 0)) {
    throw InvalidArgument("--auto-tolerance and --auto-tolerance-ms must be >= 0");
  }

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
  const int asked = request.offload_per_domain;
  if (asked > max_size) {
    throw InvalidArgument("--offload-per-domain " + std::to_string(asked) +
                          " exceeds the largest domain (" + std::to_string(max_size) + " GPUs)");
  }
  if (asked > 0 && asked == max_size && request.placement == "dedicated") {
    throw InvalidArgument("no feasible plan: --offload-per-domain " + std::to_string(asked) +
                          " dedicated servers leave no GPU to compute in the largest domain (" +
                          std::to_string(max_size) + " GPUs, so at most " +
                          std::to_string(max_size - 1) +
                          " dedicated servers); try --placement colocated, or fewer servers");
  }
  std::vector<Plan> candidates;
  for (Placement placement : placements) {
    const int k_hi = placement == Placement::dedicated ? max_size - 1 : max_size;
    const int lo = asked > 0 ? asked : 1;
    const int hi = asked > 0 ? std::min(asked, k_hi) : k_hi;  // auto skips what cannot be
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
  // The auto rule, over the candidates that fit in memory (all of them when none does and the
  // check only warns).
  bool any_fits = false;
  for (const auto& c : candidates) any_fits = any_fits || c.cost.fits;
  const bool refuse = req.memory.refuse && gpu.source != GpuModelSource::assumed;
  if (!any_fits && refuse) {
    const Plan* least = &candidates.front();
    for (const auto& c : candidates) {
      if (c.cost.memory_max_bytes < least->cost.memory_max_bytes) least = &c;
    }
    const Server& sv = tightest_server(*least);
    throw InvalidArgument(
        std::string(candidates.size() > 1 ? "no candidate fits in GPU memory: the smallest, "
                                          : "the plan does not fit in GPU memory: ") +
        placement_name(least->cost.placement) + " with " + std::to_string(least->cost.per_domain) +
        " server(s) per domain, has " + server_text(sv) + " needing " + memory_text(sv.memory) +
        " of its " + budget_text(*least, least->cost.placement) + " on " + gpu.model.name + " (" +
        gpu.how + "); try " + memory_advice(req) + " (--memory-check warn plans it anyway)");
  }
  double best = -1;
  for (const auto& c : candidates) {
    if (any_fits && !c.cost.fits) continue;
    if (best < 0 || c.cost.total_s < best) best = c.cost.total_s;
  }
  const double slack = std::max(req.auto_tolerance * best, req.auto_tolerance_s);
  size_t chosen = candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (any_fits && !candidates[i].cost.fits) continue;
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
  candidates[chosen].cost.chosen = true;
  std::vector<StepCost> costs;
  for (const auto& c : candidates) costs.push_back(c.cost);
  Plan plan = std::move(candidates[chosen]);
  plan.candidates = std::move(costs);
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const StepCost& a, const StepCost& b) { return a.total_s < b.total_s; });
  plan.model_name = model.name;
  plan.muon_params = model.muon_params();
  plan.total_params = model.total_params();
  plan.topology_source = topology_source;
  plan.placement_auto = request.placement == "auto";
  plan.per_domain_auto = request.offload_per_domain == 0;
  plan.gpu = gpu;
  add_warnings(plan);
  return plan;
}

}  // namespace muon::plan
