// Newton-Schulz coefficient schedules by name: the exact constants each source ships and each
// source's rule for running more (or fewer) steps than it lists.
//
// One Newton-Schulz step on a wide matrix X (rows <= cols), with (a, b, c) from the schedule:
//   A = X X^T,  B = b A + c A A,  X <- a X + B X
// which maps every singular value s of X to p(s) = a s + b s^3 + c s^5 and keeps the singular
// vectors (Bernstein & Newhouse 2024; Jordan et al. 2024, "Muon").
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace muon {

/// Coefficients of one odd quintic step p(s) = a s + b s^3 + c s^5. Stored in double as the
/// sources print them; the kernels round them to fp32 when they run.
struct NsCoefficients {
  double a;
  double b;
  double c;
};

/// How a schedule extends (or cuts) its listed steps to the requested count.
enum class ExtraStepRule {
  cycle,        ///< step i uses listed[i % listed.size()] (Keller, You, AOL)
  repeat_last,  ///< listed[min(i, size-1)]: later steps repeat the last one (Polar Express, CANS)
  hybrid_tail,  ///< steps-2 fixed quintic steps, then the 2 listed convergent steps (DeepSeek-V4)
};

/// A named coefficient schedule.
struct NsSchedule {
  std::string name;                  ///< canonical name used in options, CLI and plans
  std::vector<std::string> aliases;  ///< names the anchors use for the same table
  std::vector<NsCoefficients> listed;
  ExtraStepRule rule;
  int default_steps;
  int min_steps;
  std::string source;  ///< paper / reference code the constants come from

  /// The per-step coefficients for `steps` steps (0 means default_steps).
  /// Throws InvalidArgument when steps < min_steps or steps > 100.
  std::vector<NsCoefficients> coefficients(int steps) const;
};

/// All schedules, canonical names first in the order of the architecture guide:
///   keller                Keller Jordan's fixed quintic (3.4445, -4.7750, 2.0315), cycled.
///                         Aliases: "simple" (NVIDIA Emerging-Optimizers / TransformerEngine).
///   you                   the 5-step quintic set of Jiacheng You (modded-nanogpt
///                         train_gpt_medium.py), which Megatron/NVIDIA use by default; cycled.
///                         Aliases: "quintic" (NVIDIA).
///   polar_express         Polar Express (Amsel et al. 2025, arXiv:2505.16932, Algorithm 1):
///                         the paper's 8 degree-5 steps with its safety factor
///                         (a/1.01, b/1.01^3, c/1.01^5) on all but the last; extra steps repeat the
///                         last (1.875, -1.25, 0.375).
///   polar_express_raw     the paper's values without the safety factor; repeat last.
///   polar_express_nvidia  the same table as NVIDIA Emerging-Optimizers / TransformerEngine ship
///                         it (safety-scaled, rounded to 4 decimals); repeat last.
///   polar_express_105     the first 5 raw steps with safety 1.05 (Dao-AILab gram-newton-schulz,
///                         modded-nanogpt); repeat last.
///   cans                  CANS (Grishina et al. 2025, arXiv:2506.10935) as NVIDIA ships it;
///                         repeat last.
///   aol                   the AOL-tuned set of flash-newton-schulz as NVIDIA ships it (plain
///                         Frobenius normalization, no AOL rescaling); cycled. Caution: its first
///                         step is negative for s > 0.884 (p(1) = -0.585), so a near-rank-1
///                         input (one direction holding > 78 % of ||X||_F^2) comes out with
///                         that direction's sign flipped; the set was tuned for AOL-rescaled input.
///   deepseek_v4           10-step hybrid: 8 Keller quintic steps then 2 x (2.0, -1.5, 0.5)
///                         (convergent, p(1) = 1, p'(1) = 0); for N steps: N-2 quintic + 2.
const std::vector<NsSchedule>& ns_schedules();

/// Looks a schedule up by canonical name or alias. Throws InvalidArgument listing the known
/// names when there is none.
const NsSchedule& find_ns_schedule(std::string_view name);

/// Applies the composed scalar polynomial p_k(...p_1(s)) to one normalized singular value
/// s in [0, 1], in double. This is what Newton-Schulz does to each singular value exactly.
double ns_scalar_map(const std::vector<NsCoefficients>& coefficients, double s);

/// The band [lo, hi] that the composed map sends the singular values in [s_min, 1] to, found
/// on a dense logarithmic grid (4096 points) in double. The output singular values of a
/// Newton-Schulz run lie in this band for every input direction with s >= s_min.
std::pair<double, double> ns_promised_band(const std::vector<NsCoefficients>& coefficients,
                                           double s_min);

}  // namespace muon
