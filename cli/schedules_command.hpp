// `muon-offload schedules`: lists the Newton-Schulz coefficient schedules this build knows.
#pragma once

#include <ostream>
#include <string>

namespace CLI {
class App;
}

namespace muon::cli {

/// Registers the `schedules` subcommand on `app`; its callback prints to stdout.
void add_schedules_command(CLI::App& app);

/// Writes one block per schedule of ns_schedules(), in its order: the canonical name, its
/// aliases, default and minimum steps, the rule for steps beyond (or short of) the listed ones,
/// the number of listed steps and the source of the constants. Never throws (beyond stream
/// errors).
void print_schedules(std::ostream& out);

/// Writes the choices of NsAlgorithm::automatic in the table file at `path` (every machine:
/// block key, algorithm, why) or a line saying there are none yet ("" path: no file in use).
/// Throws InvalidArgument for a malformed file.
void print_algorithm_choices(std::ostream& out, const std::string& path);

}  // namespace muon::cli
