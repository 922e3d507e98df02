// A muon-offloadd process for the benchmarks: started on a socket in a private temporary folder
// with the given extra flags, waited for until healthy, stopped (SIGTERM) and its folder removed
// at destruction. MUON_OFFLOADD (the binary) comes from the build. MUON_BENCH_SERVER_ARGS (words
// separated by spaces) adds flags to every server of a run: an A/B of a server flag, e.g.
// MUON_BENCH_SERVER_ARGS="--tx-slots 16".
#pragma once

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "client/health_probe.hpp"
#include "core/error.hpp"

extern char** environ;

namespace muon::bench {

class BenchServer {
 public:
  /// `extra`: flags after --socket and --log-level warn. Throws muon::Error when the server
  /// cannot start, client::Timeout (health_probe) when it does not become healthy in `wait`.
  explicit BenchServer(const std::vector<std::string>& extra,
                       std::chrono::seconds wait = std::chrono::seconds(60)) {
    char tmpl[] = "/tmp/muon-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw Error("cannot create a temporary folder");
    dir_ = tmpl;
    socket_ = dir_ + "/s.sock";
    std::vector<std::string> args = {MUON_OFFLOADD, "--socket", socket_, "--log-level", "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (const char* more = std::getenv("MUON_BENCH_SERVER_ARGS")) {
      std::istringstream words(more);
      for (std::string w; words >> w;) args.push_back(w);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
      throw Error("cannot start " + args[0]);
    }
    client::wait_healthy(socket_, wait);
  }
  BenchServer(const BenchServer&) = delete;
  BenchServer& operator=(const BenchServer&) = delete;
  ~BenchServer() {
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  const std::string& socket() const { return socket_; }

 private:
  std::string dir_, socket_;
  pid_t pid_ = 0;
};

}  // namespace muon::bench
