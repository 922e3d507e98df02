// `muon-offload`: the user-facing command line. Each subcommand lives in its own
// <name>_command.{hpp,cpp} and registers itself here. Errors are printed as
// "muon-offload: error: <message>"; exit status 0 on success, 2 for bad usage or bad input,
// 1 for runtime failures (backend unavailable, device errors, I/O while writing).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "cli/command_error.hpp"
#include "cli/health_command.hpp"
#include "cli/orthogonalize_command.hpp"
#include "cli/plan_command.hpp"
#include "cli/schedules_command.hpp"
#include "cli/status_command.hpp"
#include "core/error.hpp"

#ifndef MUON_OFFLOAD_VERSION
#define MUON_OFFLOAD_VERSION "unknown"
#endif

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

int report(const std::string& message, int code) {
  std::cerr << "muon-offload: error: " << message << '\n';
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"muon-offload: Muon optimizer math (Newton-Schulz orthogonalization) on CPU or GPU",
               "muon-offload"};
  app.set_version_flag("--version", std::string("muon-offload ") + MUON_OFFLOAD_VERSION);
  app.require_subcommand(1);
  muon::cli::add_orthogonalize_command(app);
  muon::cli::add_schedules_command(app);
  muon::cli::add_health_command(app);
  muon::cli::add_plan_command(app);
  muon::cli::add_status_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return report(std::string(e.what()) + " (see muon-offload --help)", kExitUsage);
  } catch (const muon::cli::CommandFailed& e) {
    return report(e.message(), e.exit_code);
  } catch (const muon::InvalidArgument& e) {
    return report(e.what(), kExitUsage);
  } catch (const muon::NonFiniteError& e) {
    return report(e.what(), kExitUsage);
  } catch (const muon::BackendUnavailable& e) {
    return report(std::string("backend unavailable: ") + e.what(), kExitRuntime);
  } catch (const std::bad_alloc&) {
    return report("out of memory", kExitRuntime);
  } catch (const std::exception& e) {
    return report(e.what(), kExitRuntime);
  }
  return 0;
}
