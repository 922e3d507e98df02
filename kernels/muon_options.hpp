// Options of the Muon math: how a gradient becomes an update. One struct shared by the kernels,
// the server's registrations and the CLI, so a name means the same thing everywhere.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/elementwise.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/scale_rule.hpp"

namespace muon {

/// How X is normalized before Newton-Schulz (||X||_F always summed in double):
///   scale_invariant  X / ||X||_F, divided in double and rounded once (the default): NS(c*G) =
///                    NS(G) for every c keeping c*G finite and non-zero in fp32, bitwise for c a
///                    power of two; eps is unused, an all-zero X stays exactly zero. Right where
///                    the others are not: they shrink a gradient whose norm is near or below eps
///                    toward zero (reported and fixed in NVIDIA Emerging-Optimizers).
///   add              X / (float(||X||_F) + eps)   Keller's reference, Megatron.
///   clamp            X / max(float(||X||_F), eps) torch.optim.Muon (`norm().clamp(min=eps)`),
///                    torch.nn.functional.normalize; for parity checks against torch.
enum class EpsMode { scale_invariant, add, clamp };

/// The divisor of X per `mode` from its Frobenius norm in double (finite for any finite float
/// input, where a float norm would overflow); 0 for an all-zero matrix, whose output is then
/// exactly zero. The CPU and CUDA backends divide each element in double by it and round once.
MUON_HD double normalization_divisor(double norm, float eps, EpsMode mode) {
  if (norm == 0.0) return 0.0;
  if (mode == EpsMode::scale_invariant) return norm;
  const float f = static_cast<float>(norm);
  return mode == EpsMode::clamp ? static_cast<double>(f > eps ? f : eps)
                                : static_cast<double>(f + eps);
}

/// How the Newton-Schulz products are formed (all compute the same polynomial):
///   plain  three GEMMs per step: A = X X^T, B = bA + cAA, X = aX + BX.
///   syrk   A = X X^T and A A = A A^T as symmetric rank-k updates (half the FLOPs of both).
///   gram   iterate in Gram space (R = X X^T, Q <- p(R) Q, R <- p(R) R p(R), X = Q X0): one
///          m x m x n product to form R and one to form X = Q X0 instead of two per step; wins
///          when cols >> rows (Zhang, Amsel, Chen, Dao 2025, "Gram Newton-Schulz",
///          Dao-AILab/gram-newton-schulz). Restarted every `gram_restart` steps (X formed
///          explicitly, R recomputed from it), as that source does to stabilize it: R squares the
///          condition number, so rounding errors grow with every step spent in Gram space;
///          a restart bounds the number of such steps, and with it the error (from the SVD oracle,
///          fp32: within 2x of plain's with gram_restart 2; ~1e-4..3e-3 with no restart).
///   automatic  ("auto") the fastest of plain, syrk and gram for the matrix' shape, precision
///          and backend among those that meet the exactness contract, measured once per machine
///          and cached (kernels/ns_choice.hpp). Resolved per row block before the products run.
enum class NsAlgorithm { plain, syrk, gram, automatic };

/// The algorithm OrthogonalizeOptions start with: automatic (its one home; muon_options.cpp).
NsAlgorithm default_ns_algorithm();

/// The gram restart interval OrthogonalizeOptions start with (2: a restart after every second
/// step; 0: never restart).
inline constexpr int kDefaultGramRestart = 2;

/// How gram runs its `steps` steps: the lengths of its runs, in order, each ending with X formed
/// (a restart): `restart` steps each, the last one shorter (0: one run of all). The one home of
/// that rule for the CPU and CUDA iterations and the flop model. (Folding a lone last step into
/// the run before it, as the source's 5-step default does, reset_iterations [2], was measured:
/// 2.7..5.4x plain's error from the SVD oracle at singular values down to 1e-3, against the 2x
/// the exactness contract allows.)
std::vector<size_t> gram_run_lengths(size_t steps, int restart);

/// Inputs of the Newton-Schulz products. fp32 everywhere on the CPU; the CUDA backend rounds X to
/// bf16 and accumulates in fp32 (`bf16`, its default) or stays in fp32.
///   torch_bf16  torch.optim.Muon's bfloat16 rounding points, for parity checks against it
///               (torch/optim/_muon.py, `_zeropower_via_newtonschulz` on bf16 tensors): the input
///               rounded to bf16, its Frobenius norm rounded to bf16 (and guarded per eps_mode
///               in bf16), X / norm rounded to bf16, then each of A = X X^T, B = b A + c A A and
///               X <- a X + B X accumulated in fp32 and rounded once to bf16, as torch's bf16
///               matmul/addmm do on CPU and GPU. The CPU backend emulates it (fp32 GEMMs, each
///               output narrowed); plain products only. Not on the CUDA backend.
enum class Precision { backend_default, fp32, bf16, torch_bf16 };

/// What to do with a gradient holding NaN or Inf:
///   error  refuse the step with NonFiniteError naming the matrix; momentum untouched (default).
///   skip   return a zero update and leave the momentum untouched.
enum class NonFinitePolicy { error, skip };

/// Options of the orthogonalization U = extra_scale * scale_rule(r, c) * NS(X).
struct OrthogonalizeOptions {
  std::string schedule = "keller";  ///< a name or alias from ns_schedules()
  int steps = 0;                    ///< 0: the schedule's default (5 with `coefficients`)
  /// Empty, or one quintic (a, b, c) used for every step instead of `schedule`
  /// (torch.optim.Muon's ns_coefficients). See ns_coefficients().
  std::vector<double> coefficients;
  float eps = 1e-7f;
  EpsMode eps_mode = EpsMode::scale_invariant;
  ScaleRule scale_rule = ScaleRule::keller;
  double extra_scale = 1.0;
  /// Row blocks orthogonalized separately (fused QKV), e.g. {q_rows, k_rows, v_rows}; empty
  /// means one block. Must add up to the matrix' rows.
  std::vector<int64_t> row_splits;
  NsAlgorithm algorithm = default_ns_algorithm();
  /// Steps between restarts of the gram iteration (X = Q X formed, R recomputed); 0 never
  /// restarts. Used by NsAlgorithm::gram (and automatic when it picks gram); 0..100.
  int gram_restart = kDefaultGramRestart;
  Precision precision = Precision::backend_default;
  NonFinitePolicy nonfinite = NonFinitePolicy::error;
};

/// Momentum options; the state itself (fp32, same shape as the parameter) lives with the caller.
struct MomentumOptions {
  MomentumConvention convention = MomentumConvention::sum;
  /// In double, as the trainer gives it: the float constants are rounded from it once
  /// (momentum_coefficients(), torch's rounding of a Python float).
  double mu = 0.95;
  bool nesterov = true;
};

/// Everything that turns a gradient into an update.
struct MuonOptions {
  MomentumOptions momentum;
  OrthogonalizeOptions orthogonalize;
};

/// A parameter's global shape: `batch` independent matrices of rows x cols (batch 1 for a
/// plain matrix, the expert count for an MoE stack [b, r, c]). Row-major fp32.
struct MatrixShape {
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return batch * rows * cols; }
  std::string str() const;
};

/// Shape from tensor dims: [r, c] or [b, r, c]. Throws InvalidArgument naming `matrix_name` for
/// 0-D/1-D/4-D+ input or a zero extent (Muon is for matrices; flatten conv kernels first).
MatrixShape matrix_shape_from_dims(std::span<const int64_t> dims, std::string_view matrix_name);

/// The row blocks of a matrix: `row_splits`, or {rows} when empty. Throws InvalidArgument naming
/// the matrix when a block is not positive or the blocks do not add up to rows.
std::vector<int64_t> row_blocks(const OrthogonalizeOptions& options, const MatrixShape& shape,
                                std::string_view matrix_name);

/// Steps of fixed `coefficients` when `steps` is 0: torch.optim.Muon's ns_steps default.
inline constexpr int kFixedCoefficientSteps = 5;

/// The per-step coefficients `options` ask for: `coefficients` (a, b, c) repeated `steps` times
/// (kFixedCoefficientSteps when 0), else the schedule's for `steps`. Throws InvalidArgument for an
/// unknown schedule, steps out of the schedule's range or above 100, or coefficients that are
/// not exactly 3 finite numbers.
std::vector<NsCoefficients> ns_coefficients(const OrthogonalizeOptions& options);

/// Checks everything about options + shape that can be checked without data (coefficients or
/// schedule name and steps, eps, splits, extra_scale, precision torch_bf16 with plain products,
/// mu). Throws InvalidArgument naming the matrix.
void validate(const MuonOptions& options, const MatrixShape& shape, std::string_view matrix_name);
void validate(const OrthogonalizeOptions& options, const MatrixShape& shape,
              std::string_view matrix_name);

/// Name parsers for the CLI, configs and the wire; each throws InvalidArgument listing the
/// accepted names. The names (and the *_names lists) are those of muon_option_fields().
EpsMode parse_eps_mode(std::string_view name);
NsAlgorithm parse_ns_algorithm(std::string_view name);
Precision parse_precision(std::string_view name);
NonFinitePolicy parse_nonfinite_policy(std::string_view name);
/// "sum", "ema", "none" (alias "client": client-held momentum).
MomentumConvention parse_momentum_convention(std::string_view name);

/// The canonical name of each value (what the parsers above accept and the wire carries).
std::string_view eps_mode_name(EpsMode mode);
std::string_view ns_algorithm_name(NsAlgorithm algorithm);
std::string_view precision_name(Precision precision);  ///< backend_default: "default"
std::string_view nonfinite_policy_name(NonFinitePolicy policy);
std::string_view momentum_convention_name(MomentumConvention convention);

/// The canonical names each parser accepts, in declaration order.
std::vector<std::string> eps_mode_names();
std::vector<std::string> ns_algorithm_names();
std::vector<std::string> precision_names();
std::vector<std::string> nonfinite_policy_names();
std::vector<std::string> momentum_convention_names();

}  // namespace muon
