// Update scale rules by unambiguous names. The anchors' own names clash (NVIDIA's "spectral" is
// sqrt(max(r, c)); dion's "spectral_norm" is sqrt(r / c)), so this project names each rule by
// its formula. r = rows (fan-out), c = cols (fan-in) of the *global* matrix, or of one row
// block when the parameter is split (fused QKV); never of a shard.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace muon {

/// Scale rules.
///   keller       max(1, r/c)^0.5. Keller Jordan's Muon; torch.optim.Muon adjust_lr_fn
///                "original"; NVIDIA Emerging-Optimizers / Megatron "shape_scaling".
///   match_adamw  0.2 * sqrt(max(r, c)). Moonlight (Liu et al. 2025, arXiv:2502.16982);
///                torch.optim.Muon "match_rms_adamw"; Megatron "match_rms_adamw".
///   sqrt_max     sqrt(max(r, c)). NVIDIA Emerging-Optimizers "spectral".
///   unit_rms     sqrt(r/c): unit RMS-to-RMS operator norm. dion "spectral_norm"; NVIDIA
///                "unit_rms_norm"; Bernstein's modular norm for linear layers.
///   none         1.
enum class ScaleRule { keller, match_adamw, sqrt_max, unit_rms, none };

/// Parses a canonical rule name. Alias names are refused on purpose (they are ambiguous); the
/// error text says which canonical rule each alias maps to. Throws InvalidArgument.
ScaleRule parse_scale_rule(std::string_view name);

/// The canonical name of a rule.
std::string_view scale_rule_name(ScaleRule rule);

/// The rule's factor for a global matrix (or split block) of `rows` x `cols`, in double.
/// Throws InvalidArgument when rows or cols is not positive.
double scale_factor(ScaleRule rule, int64_t rows, int64_t cols);

}  // namespace muon
