#include "cli/orthogonalize_command.hpp"

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/npy.hpp"
#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/muon_option_fields.hpp"
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
      "NS: X = G / ||G||_F (see --eps-mode), transposed when r > c; each step A = X X^T,\n"
      "B = b A + c A A, X = a X + B X, with (a, b, c) from the schedule or --coefficients.");
  sub->add_option("-i,--input", args->input, "Input .npy (G)")->required();
  sub->add_option("-o,--output", args->output, "Output .npy (U), replaced if present")->required();
  for (const OptionField& f : muon_option_fields()) {
    if (f.cli_flag.empty()) continue;
    std::string doc(f.doc);
    if (f.name == "schedule") doc += ": " + schedule_names();
    auto* opt = sub->add_option(std::string(f.cli_flag), args->option_text[std::string(f.name)], doc);
    if (f.type == OptionType::integer_list || f.type == OptionType::number_list) {
      opt->delimiter(',');
    } else {
      opt->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      opt->default_str(option_default_text(f));
    }
  }
  sub->add_option("--backend", args->backend,
                  "cpu (OpenBLAS fp32, the oracle), cuda, or auto (CUDA when usable, else CPU)")
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "OpenBLAS threads; 0: OpenBLAS' own setting")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->callback([args] { run_orthogonalize(*args); });
}

void run_orthogonalize(const OrthogonalizeArgs& args) {
  MuonOptions muon_options;
  for (const auto& [name, values] : args.option_text) {
    if (values.empty()) continue;
    const OptionField* field = find_option_field(name);
    if (!field) throw InvalidArgument("unknown option '" + name + "'");
    std::string text;
    for (const auto& v : values) text += (text.empty() ? "" : ",") + v;
    set_option_from_text(muon_options, *field, text);
  }
  const OrthogonalizeOptions& options = muon_options.orthogonalize;

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
