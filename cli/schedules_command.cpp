#include "cli/schedules_command.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/text_table.hpp"
#include "kernels/ns_choice.hpp"
#include "kernels/ns_schedule.hpp"

namespace muon::cli {
namespace {

std::string rule_name(ExtraStepRule rule) {
  switch (rule) {
    case ExtraStepRule::cycle:
      return "cycle";
    case ExtraStepRule::repeat_last:
      return "repeat_last";
    case ExtraStepRule::hybrid_tail:
      return "hybrid_tail";
  }
  return "?";
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "-" : s;
}

}  // namespace

void print_schedules(std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "ALIASES", "STEPS", "EXTRA STEPS", "SOURCE"}};
  for (const auto& s : ns_schedules()) {
    rows.push_back({s.name, join(s.aliases),
                    std::to_string(s.default_steps) + " (min " + std::to_string(s.min_steps) + ")",
                    rule_name(s.rule) + " (" + std::to_string(s.listed.size()) + " listed)",
                    s.source});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out << line << '\n';
  }
  out << "\nEXTRA STEPS: how --steps beyond (or short of) the listed steps are filled:\n"
         "  cycle        step i uses listed[i % listed]\n"
         "  repeat_last  later steps repeat the last listed step\n"
         "  hybrid_tail  steps-2 Keller quintic steps, then the 2 listed convergent steps\n";
}

void print_algorithm_choices(std::ostream& out, const std::string& path) {
  out << "\nALGORITHM CHOICES of --algorithm auto (the default), per machine and block: ";
  if (path.empty()) {
    out << "no table file (MUON_OFFLOAD_NS_TABLE=none): each process measures its own\n";
    return;
  }
  out << path << "\n";
  const auto entries = read_ns_choice_file(path);
  if (entries.empty()) {
    out << "  none measured yet: the first process to run a block shape measures plain, syrk and "
           "gram on it and writes its choice here\n";
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"MACHINE", "BLOCK", "ALGORITHM", "BATCHING", "WHY"}};
  for (const auto& e : entries) {
    rows.push_back({e.machine, e.key, std::string(ns_algorithm_name(e.choice.algorithm)),
                    e.choice.side_by_side ? "side by side" : "one at a time",
                    e.choice.reason +
                        (e.choice.batch_reason.empty() ? "" : "; " + e.choice.batch_reason)});
  }
  print_table(out, rows, "  ");
}

void add_schedules_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "schedules",
      "List the Newton-Schulz coefficient schedules (names, aliases, steps, sources) and the "
      "algorithms auto chose on this machine");
  auto table = std::make_shared<std::string>(NsChoiceTable::default_path());
  sub->add_option("--table", *table,
                  "The choice table of --algorithm auto to show (default: $MUON_OFFLOAD_NS_TABLE, "
                  "else ~/.cache/muon-offload/ns-choices.json)");
  sub->callback([table] {
    print_schedules(std::cout);
    print_algorithm_choices(std::cout, *table);
  });
}

}  // namespace muon::cli
