#include "cli/orthogonalize_command.hpp"

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/npy.hpp"
#include "kernels/backend.hpp"
#include "kernels/muon_options.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/scale_rule.hpp"

namespace muon::cli {
namespace {

std::string schedule_names() {
  std::string s;
  for (const auto& sc : ns_schedules()) s += (s.empty() ? "" : ", ") + sc.name;
  return s;
}

}  // namespace

void add_orthogonalize_command(CLI::App& app) {
  auto args = std::make_shared<OrthogonalizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "orthogonalize",
      "U = extra_scale * scale_rule(r, c) * NewtonSchulz(G) for every matrix of a .npy file\n"
      "(float32 '<f4', C order, 2-D [r, c] or 3-D [b, r, c]); writes U with G's shape.\n"
      "NS: X = G / (||G||_F + eps), transposed when r > c; each step A = X X^T,\n"
      "B = b A + c A A, X = a X + B X, with (a, b, c) from the schedule.");
  sub->add_option("-i,--input", args->input, "Input .npy (G)")->required();
  sub->add_option("-o,--output", args->output, "Output .npy (U), replaced if present")->required();
  sub->add_option(
         "--schedule", args->schedule,
         "Coefficient schedule or alias (see `muon-offload schedules`): " + schedule_names())
      ->capture_default_str();
  sub->add_option("--steps", args->steps, "Newton-Schulz steps; 0: the schedule's default")
      ->capture_default_str();
  sub->add_option("--eps", args->eps, "Guard of the Frobenius normalization")
      ->capture_default_str();
  sub->add_option("--eps-mode", args->eps_mode,
                  "add: X / (||X||_F + eps) (Keller, torch.optim.Muon); clamp: X / max(||X||_F, "
                  "eps) (NVIDIA)")
      ->capture_default_str();
  sub->add_option("--scale", args->scale,
                  "Scale rule: keller max(1, r/c)^0.5, match_adamw 0.2 sqrt(max(r, c)), sqrt_max "
                  "sqrt(max(r, c)), unit_rms sqrt(r/c), none 1; r, c of the row block")
      ->capture_default_str();
  sub->add_option("--extra-scale", args->extra_scale, "Extra factor times the scale rule")
      ->capture_default_str();
  sub->add_option("--split", args->split,
                  "Row blocks orthogonalized separately (fused QKV), e.g. 1024,256,256; must add "
                  "up to the rows")
      ->delimiter(',');
  sub->add_option("--backend", args->backend,
                  "cpu (OpenBLAS fp32, the oracle), cuda, or auto (CUDA when usable, else CPU)")
      ->capture_default_str();
  sub->add_option("--algorithm", args->algorithm,
                  "plain (3 GEMMs/step), syrk (symmetric products), gram (Gram-space iteration, "
                  "less exact; for cols >> rows)")
      ->capture_default_str();
  sub->add_option("--precision", args->precision,
                  "default (the backend's: fp32 on CPU, bf16 on CUDA), fp32, bf16 (CUDA only)")
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "OpenBLAS threads; 0: OpenBLAS' own setting")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->callback([args] { run_orthogonalize(*args); });
}

void run_orthogonalize(const OrthogonalizeArgs& args) {
  OrthogonalizeOptions options;
  options.schedule = args.schedule;
  options.steps = args.steps;
  options.eps = args.eps;
  options.eps_mode = parse_eps_mode(args.eps_mode);
  options.scale_rule = parse_scale_rule(args.scale);
  options.extra_scale = args.extra_scale;
  options.row_splits = args.split;
  options.algorithm = parse_ns_algorithm(args.algorithm);
  options.precision = parse_precision(args.precision);

  const NpyArray g = read_npy(args.input);
  const MatrixShape shape = matrix_shape_from_dims(g.shape, args.input);
  validate(options, shape, args.input);

  BackendConfig config;
  config.cpu_threads = args.threads;
  const auto backend = make_backend(args.backend, config);
  std::vector<float> u(g.data.size());
  backend->orthogonalize(args.input, shape, g.data.data(), u.data(), options);
  write_npy(args.output, g.shape, u);
}

}  // namespace muon::cli
