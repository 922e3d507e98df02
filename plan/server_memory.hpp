// The device memory a GPU server needs, modelled on what its GPU data plane allocates
// (daemon/step/device_param_storage.cpp, daemon/device_contribution_store.cpp,
// kernels/device_muon.cu, kernels/device_newton_schulz.cu), and what it may use of its GPU.
//
// Per owned parameter of n elements (fp32 throughout):
//   momentum 4n, reduced gradient 4n, update 4n;
//   one buffer per contributor 4 x (elements that contributor pushes): the server sums the
//   contributions in contributor order once all have arrived, so it keeps each one whole. A
//   contributor is a compute rank pushing to this server, or a relay's partial sum.
// Per relayed parameter: gradient 4n, update 4n, the contributors' buffers.
// Per session (each compute rank connected to it): the receive and result rings,
//   (tx_slots + rx_slots) x slot_bytes (muon-offloadd's --tx-slots, --rx-slots, --slot-kib).
// Once: the step runner's scratch (daemon/step/device_step_runner.cpp), where a step's momenta
//   are stepped so that a refused step leaves the momentum untouched: 4 x the larger of the
//   largest parameter and the largest batch, plus a batch's gradients and updates 8 x the
//   largest batch. A batch is two or more owned parameters of one Newton-Schulz shape, at most
//   kMaxBatchElements elements (kernels/step_batch.hpp), all of a shape's taken as ready at once
//   (a trainer in shard mode pushes every gradient after its all-reduce).
// Once: the Newton-Schulz workspace of its largest call, a parameter or a batch (count
//   matrices of m x k, m <= k): fp32 gathered blocks 4 c m k, X ping-pong (bf16: 2 x 2 c m k;
//   fp32: 4 c m k), A and B (bf16: 2 x 2 c m^2; fp32: 2 x 4 c m^2), the 32 MiB cuBLAS
//   workspace; and the CUDA context with cuBLAS loaded, about 1 GiB (context_bytes).
// Budget: a dedicated server may fill its GPU; a co-located one shares it with a trainer, so it
// gets `colocated_share` of it (the trainer's own use is not known to the planner).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/muon_options.hpp"
#include "plan/model_config.hpp"

namespace muon::plan {

/// How the compute ranks push their gradients (OffloadMuon's `mode`, client/python).
enum class ClientMode {
  server_reduce,  ///< every rank pushes its whole gradient; the server sums the ranks
  shard,          ///< ranks all-reduce first, then each pushes 1 / world of every parameter
};
const char* client_mode_name(ClientMode mode);
/// "server_reduce" or "shard"; throws InvalidArgument otherwise.
ClientMode parse_client_mode(const std::string& name);

struct MemorySettings {
  ClientMode client_mode = ClientMode::server_reduce;
  /// Device memory of one GPU, bytes; 0: unknown (then nothing is checked).
  double gpu_memory_bytes = 0;
  /// Share of its GPU a co-located server may use; the trainer keeps the rest.
  double colocated_share = 0.25;
  /// A server over this share of its budget gets a warning (tight, fragmentation may fail it).
  double warn_share = 0.90;
  uint32_t tx_slots = 8;  ///< muon-offloadd's defaults (transport/shm_segment.hpp)
  uint32_t rx_slots = 8;
  double slot_bytes = 4.0 * (1 << 20);
  double context_bytes = 1.0 * (1 << 30);  ///< CUDA context + cuBLAS handle, per process
  /// When false, a plan that does not fit is only warned about (muon-offload plan
  /// --memory-check warn); when true (default) it is refused.
  bool refuse = true;
};

/// One server's device memory, bytes, by what it holds.
struct ServerMemory {
  double momentum = 0;       ///< momentum, owned parameters
  double buffers = 0;        ///< reduced gradient and update, owned and relayed parameters
  double scratch = 0;        ///< the step runner's: a call's momenta, a batch's gradients, updates
  double contributions = 0;  ///< per-contributor buffers
  double rings = 0;          ///< sessions' receive and result rings
  double workspace = 0;      ///< Newton-Schulz of the largest call, cuBLAS workspace
  double context = 0;        ///< CUDA context
  double budget = 0;         ///< what it may use; 0: unknown GPU memory
  double total() const {
    return momentum + buffers + scratch + contributions + rings + workspace + context;
  }
  /// True when the budget is unknown or the total stays within it.
  bool fits() const { return budget <= 0 || total() <= budget; }
};

/// Bytes of the Newton-Schulz workspace for one parameter at `precision` (bf16 unless fp32).
double ns_workspace_bytes(const MuonMatrix& m, Precision precision);

}  // namespace muon::plan
