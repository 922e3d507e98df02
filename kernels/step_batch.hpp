// How large one batched Muon step may be. The server's Scheduler (daemon/scheduler.hpp) runs the
// ready parameters of one shape and options as one call of its StepRunner, and that call keeps
// scratch in proportion to the batch: on the GPU data plane the batch's momenta, gradients and
// updates concatenated (DeviceStepRunner, 12 bytes per element, kept at the largest batch seen),
// and Newton-Schulz workspace for the batch's whole count. Uncapped, a trainer that pushes every
// gradient at once (OffloadMuon's shard mode, after its all-reduce) would batch every same-shape
// matrix a server owns: Llama-3-8B's 64 matrices of 4096 x 4096 alone are 1.07 G elements, 13 GB
// of scratch. plan/server_memory.hpp models the scratch of a batch of at most this size.
#pragma once

#include <cstdint>

namespace muon {

/// Most elements (summed over its parameters) one batched step takes: 2^26, 256 MiB per fp32
/// buffer. Batching pays for small matrices, whose calls are short; a batch at the cap already
/// holds sixteen 2048 x 2048 matrices. A parameter larger than the cap runs alone.
inline constexpr int64_t kMaxBatchElements = int64_t{1} << 26;

}  // namespace muon
