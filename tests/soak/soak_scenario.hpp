// What the soak job trains: its parameter sets, how each rank shards each parameter, the options,
// the hash every rank writes for every update it receives, and the uninterrupted reference run.
//
// Gradients are those of tests/daemon/scenario.hpp (grad_value: a hash of parameter, step, rank
// and element), so rank processes and the driver agree on every value without exchanging any.
// A step that the server dropped (a rank was lost mid-step) is pushed again with the same step
// number and the same data, as a trainer restarting from its last completed step would: the
// server requires consecutive steps per parameter. The updates of every completed step must then
// equal those of a run that was never interrupted — which holds only if no dropped step touched
// the momentum and no step was applied twice.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "tests/daemon/scenario.hpp"

namespace muon::soak {

/// One parameter of the soak job: name, global shape, row splits, and its sharding mode
/// (a mode of testing::push_ranges: replicated, rows, flat_uneven, halves).
struct SoakParam {
  testing::ScenarioParam param;
  std::string sharding;
};

/// The parameter sets, by name:
///   small  the integration tests' GPT-like set (64x96, 96x64, a 3x32x40 expert stack, a 96x32
///          fused QKV): a step takes milliseconds; the CTest short form uses it.
///   gpt2   one GPT-2 small block as torch Linear weights: attn.c_attn 2304x768 (QKV row splits
///          768/768/768), attn.c_proj 768x768, mlp.c_fc 3072x768, mlp.c_proj 768x3072, plus a
///          4x256x768 expert stack: ~140 GFLOP of Newton-Schulz per step (about 1.5 s on one
///          OpenBLAS thread here).
/// Each parameter uses another sharding mode. Throws InvalidArgument for an unknown name.
std::vector<SoakParam> soak_params(const std::string& set);

/// Muon options of a parameter: defaults (sum momentum, Nesterov, keller schedule and scale)
/// with mu 0.9 and the parameter's row splits.
MuonOptions soak_options(const SoakParam& p);

/// XXH3-64 of `count` fp32 values' bytes: equal hashes stand for bitwise-equal updates.
uint64_t update_hash(const float* values, int64_t count);

/// The job run without interruption in process, with the server's kernels (CPU backend,
/// `threads` OpenBLAS threads: the server must run with the same count for bitwise equality).
class ReferenceRun {
 public:
  ReferenceRun(std::vector<SoakParam> params, int world, int threads);

  /// Runs the next step (steps_done()) of every parameter; returns the update hashes, by
  /// parameter index.
  std::vector<uint64_t> next_step();
  int64_t steps_done() const { return steps_done_; }

 private:
  std::vector<SoakParam> params_;
  int world_;
  std::unique_ptr<Backend> backend_;
  std::vector<std::vector<float>> momentum_;
  std::vector<float> update_;
  int64_t steps_done_ = 0;
};

}  // namespace muon::soak
