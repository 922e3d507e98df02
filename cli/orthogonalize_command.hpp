// `muon-offload orthogonalize`: U = extra_scale * scale_rule(block) * NS(G) of a .npy file, on
// the CPU (OpenBLAS, the oracle) or CUDA backend, so a user can compare the project's math with
// their own stack.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace muon::cli {

/// The flags of `orthogonalize`, as typed. The Muon options' flags (one per orthogonalize field
/// of kernels/muon_option_fields.hpp: --schedule, --steps, --coefficients, --eps, --eps-mode,
/// --scale, --extra-scale, --split, --algorithm, --precision, --nonfinite) are read through that
/// table when the command runs, so that a bad value is reported with the accepted names.
struct OrthogonalizeArgs {
  std::string input;   ///< .npy, float32 '<f4', C order, [r, c] or [b, r, c]
  std::string output;  ///< .npy written with the input's shape, '<f4'
  /// Option field name -> the values given to its flag (a list flag's comma-separated parts).
  std::map<std::string, std::vector<std::string>> option_text;
  std::string backend = "cpu";  ///< cpu | cuda | auto
  int threads = 0;              ///< OpenBLAS threads; 0: OpenBLAS' own setting
};

/// Registers the `orthogonalize` subcommand on `app`; its callback calls run_orthogonalize.
void add_orthogonalize_command(CLI::App& app);

/// Reads args.input, orthogonalizes every matrix of the batch (each row block separately) with
/// make_backend(args.backend)->orthogonalize(...), and writes args.output (same shape, float32).
/// The matrix name in messages is the input path.
/// Throws muon::InvalidArgument (unreadable or unsupported .npy, unknown name, bad option or
/// split, bf16 on the CPU), muon::NonFiniteError (input holds NaN/Inf), muon::BackendUnavailable
/// (--backend cuda without a usable GPU), muon::DeviceError, muon::Error (write failure).
void run_orthogonalize(const OrthogonalizeArgs& args);

}  // namespace muon::cli
