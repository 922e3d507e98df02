#include "cli/health_command.hpp"

#include <iostream>
#include <memory>
#include <string>

#include "client/health_probe.hpp"

namespace muon::cli {

void add_health_command(CLI::App& app) {
  struct Args {
    std::string socket;
    int64_t timeout_ms = 10000;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "health", "Wait until a muon-offloadd answers health checks as ready (exit 0), or fail");
  sub->add_option("--socket", args->socket, "The server's Unix socket")->required();
  sub->add_option("--timeout-ms", args->timeout_ms, "How long to keep trying")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  sub->callback([args] {
    const auto h = client::wait_healthy(args->socket, std::chrono::milliseconds(args->timeout_ms));
    std::cout << "ready: " << args->socket << " (" << h.sessions << " session(s), " << h.parameters
              << " parameter(s))\n";
  });
}

}  // namespace muon::cli
