// `muon-offload orthogonalize`: U = extra_scale * scale_rule(block) * NS(G) of a .npy file, on
// the CPU (OpenBLAS, the oracle) or CUDA backend, so a user can compare the project's math with
// their own stack.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace muon::cli {

/// The flags of `orthogonalize`, as typed (names are parsed when the command runs, so that a
/// bad name is reported with the list of accepted ones).
struct OrthogonalizeArgs {
  std::string input;                ///< .npy, float32 '<f4', C order, [r, c] or [b, r, c]
  std::string output;               ///< .npy written with the input's shape, '<f4'
  std::string schedule = "keller";  ///< name or alias from ns_schedules()
  int steps = 0;                    ///< 0: the schedule's default
  float eps = 1e-7f;
  std::string eps_mode = "add";  ///< add | clamp
  std::string scale = "keller";  ///< keller | match_adamw | sqrt_max | unit_rms | none
  double extra_scale = 1.0;
  std::vector<int64_t> split;         ///< row blocks; empty: one block
  std::string backend = "cpu";        ///< cpu | cuda | auto
  std::string algorithm = "plain";    ///< plain | syrk | gram
  std::string precision = "default";  ///< default | fp32 | bf16
  int threads = 0;                    ///< OpenBLAS threads; 0: OpenBLAS' own setting
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
