// muon_soak_rank: one compute rank of the soak job, started, killed (SIGKILL) and restarted by
// muon_soak. It connects with its rank, registers the job's parameters (the server answers once
// every rank is connected), asks the server for each parameter's last applied step and then runs
// rounds: push its shard of every parameter's gradient for the parameter's next step (random
// chunk sizes, random order), commit, wait for every update and report its XXH3 hash. After a
// round with a failed step (peer_lost when another rank was killed) it disconnects, reports
// `recover` and waits for the driver's `go`, then does it all again: the dropped steps are pushed
// again with the same data. Events and commands: tests/soak/rank_channel.hpp.
// Exit codes: 0 after `exit`, 2 bad arguments, 4 gave up (a `fatal` event says why).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include "client/client.hpp"
#include "tests/soak/rank_channel.hpp"
#include "tests/soak/soak_scenario.hpp"

using namespace muon;
using namespace muon::soak;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

struct Args {
  std::string socket, shapes = "small";
  int rank = 0, world = 1;
  int64_t target = 0;
  int64_t op_timeout_ms = 45000;  // every client wait fails with a clear error after this
  int64_t wait_ms = 120000;       // longest wait for a driver command
  uint64_t seed = 1;
  int64_t backward_us = 0;  // spread over each round's pushes, like a backward pass
};

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
}

class SoakRank {
 public:
  explicit SoakRank(Args a)
      : a_(std::move(a)), params_(soak_params(a_.shapes)), target_(a_.target) {
    for (const auto& p : params_) {
      client::ParameterRegistration r;
      r.name = p.param.name;
      r.shape = p.param.shape;
      r.options = soak_options(p);
      r.push = testing::push_ranges(p.sharding, p.param, a_.rank, a_.world);
      r.want = {{0, p.param.numel()}};
      regs_.push_back(r);
      updates_.emplace_back(static_cast<size_t>(p.param.numel()));
    }
    next_.assign(params_.size(), 0);
  }

  int run() {
    for (;;) {
      const auto t0 = Clock::now();
      connect();
      client_->register_parameters(regs_);
      ch_.emit("registered " + std::to_string(ms_since(t0)));
      resync();
      for (;;) {
        while (auto cmd = ch_.next_command(milliseconds(0))) handle(*cmd);
        if (finished()) {
          ch_.emit("done");
          if (wait_until_not_finished()) continue;
          client_.reset();  // goodbye
          return 0;
        }
        if (!round()) break;
      }
      client_.reset();  // goodbye: the server drops what this rank left unfinished
      ch_.emit("recover");
      for (bool go = false; !go;) {
        auto cmd = ch_.next_command(milliseconds(a_.wait_ms));
        if (!cmd) throw std::runtime_error("no go from the driver within the wait bound");
        go = *cmd == "go";
        if (!go) handle(*cmd);
      }
    }
  }

 private:
  void handle(const std::string& cmd) {
    const auto w = split_words(cmd, 2);
    if (w.size() == 2 && w[0] == "target") {
      target_ = std::stoll(w[1]);
    } else if (w.size() == 1 && w[0] == "exit") {
      exit_asked_ = true;
    } else {
      throw std::runtime_error("unexpected driver command '" + cmd + "'");
    }
  }

  bool finished() const {
    return std::all_of(next_.begin(), next_.end(), [&](int64_t s) { return s >= target_; });
  }

  // Done: waits for exit (false) or a higher target (true).
  bool wait_until_not_finished() {
    while (!exit_asked_) {
      auto cmd = ch_.next_command(milliseconds(a_.wait_ms));
      if (!cmd) throw std::runtime_error("no exit from the driver within the wait bound");
      handle(*cmd);
      if (!finished()) return true;
    }
    return false;
  }

  // Connects, retrying while the server still holds this rank's previous session (it notices a
  // killed process or a goodbye on another socket, possibly after this hello).
  void connect() {
    client::ClientConfig cfg;
    cfg.servers = {a_.socket};
    cfg.rank = a_.rank;
    cfg.world_size = a_.world;
    cfg.name = "soak rank " + std::to_string(a_.rank);
    cfg.op_timeout = milliseconds(a_.op_timeout_ms);
    const auto give_up = Clock::now() + milliseconds(a_.op_timeout_ms);
    int retries = 0;
    for (;;) {
      try {
        client_ = std::make_unique<client::Client>(cfg);
        break;
      } catch (const client::ServerError& e) {
        const bool stale = std::string(e.what()).find("already connected") != std::string::npos;
        if (!stale || Clock::now() > give_up) throw;
        ++retries;
        std::this_thread::sleep_for(milliseconds(20));
      }
    }
    if (retries > 0) ch_.emit("hello_retry " + std::to_string(retries));
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
      if (auto at = line.find("/dev/shm/muon-"); at != std::string::npos) {
        ch_.emit("segment " + line.substr(at + 9, line.find(' ', at) - at - 9));
      }
    }
  }

  // Each parameter's next step is the one after the server's last applied step.
  void resync() {
    const auto give_up = Clock::now() + milliseconds(a_.op_timeout_ms);
    for (size_t pi = 0; pi < params_.size(); ++pi) {
      for (;;) {
        try {
          int64_t last = -1;
          client_->fetch_momentum(params_[pi].param.name, &last);
          next_[pi] = last + 1;
          break;
        } catch (const client::ServerError& e) {
          const bool busy = std::string(e.what()).find("computing") != std::string::npos;
          if (!busy || Clock::now() > give_up) throw;
          std::this_thread::sleep_for(milliseconds(10));
        }
      }
    }
  }

  void report(const std::string& code, const std::string& param, int64_t step, int rank,
              const std::string& what) {
    ch_.emit("error " + code + " " + (param.empty() ? "-" : param) + " " + std::to_string(step) +
             " " + std::to_string(rank) + " " + one_line(what));
  }

  // One round over every parameter not yet at the target. False when a step failed.
  bool round() {
    const auto t0 = Clock::now();
    struct Chunk {
      size_t pi;
      int64_t offset, count;
    };
    std::vector<size_t> todo;
    for (size_t pi = 0; pi < params_.size(); ++pi) {
      if (next_[pi] < target_) todo.push_back(pi);
    }
    std::mt19937_64 rng(a_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(a_.rank) * 7919 +
                        attempt_++);
    std::vector<Chunk> chunks;
    for (size_t pi : todo) {
      for (const auto& r : regs_[pi].push) {
        for (int64_t off = r.begin; off < r.end;) {
          const int64_t n =
              std::min(r.end - off, std::uniform_int_distribution<int64_t>(1, r.size())(rng));
          chunks.push_back({pi, off, n});
          off += n;
        }
      }
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    // Each parameter is committed right after its last chunk, as a trainer's gradient hook
    // does, so that a kill can land between two parameters' commits.
    std::vector<size_t> chunks_left(params_.size(), 0);
    for (const auto& c : chunks) ++chunks_left[c.pi];
    const auto pace = chunks.empty() ? std::chrono::microseconds(0)
                                     : std::chrono::microseconds(a_.backward_us) /
                                           static_cast<int64_t>(chunks.size());
    int errors = 0;
    bool connection_ok = true;
    try {
      std::vector<float> v;
      for (const auto& c : chunks) {
        v.resize(static_cast<size_t>(c.count));
        for (int64_t i = 0; i < c.count; ++i) {
          v[i] = testing::grad_value(static_cast<int>(c.pi), next_[c.pi], a_.rank, c.offset + i);
        }
        if (pace.count() > 0) std::this_thread::sleep_for(pace);  // "backward" computing it
        client_->push(params_[c.pi].param.name, next_[c.pi], c.offset, v.data(), c.count);
        if (--chunks_left[c.pi] == 0) client_->commit(params_[c.pi].param.name, next_[c.pi]);
      }
    } catch (const client::Timeout& e) {
      report("timeout", "", -1, a_.rank, e.what());
      ++errors;
      connection_ok = false;
    } catch (const client::ConnectionLost& e) {
      report("connection", "", -1, a_.rank, e.what());
      ++errors;
      connection_ok = false;
    }
    for (size_t k = 0; connection_ok && k < todo.size(); ++k) {
      const size_t pi = todo[k];
      const auto& name = params_[pi].param.name;
      try {
        if (!client_->wait_update(name, next_[pi], updates_[pi].data())) {
          report("skipped", name, next_[pi], a_.rank, "the server skipped the step");
          ++errors;
          continue;
        }
        ch_.emit("update " + std::to_string(pi) + " " + std::to_string(next_[pi]) + " " +
                 hex(update_hash(updates_[pi].data(), static_cast<int64_t>(updates_[pi].size()))));
        ++next_[pi];
      } catch (const client::ServerError& e) {
        report(std::string(error_code_name(e.code)), e.param, e.step, e.rank, e.what());
        ++errors;
      } catch (const client::Timeout& e) {
        report("timeout", name, next_[pi], a_.rank, e.what());
        ++errors;
      } catch (const client::ConnectionLost& e) {
        report("connection", name, next_[pi], a_.rank, e.what());
        ++errors;
        connection_ok = false;
      }
    }
    ch_.emit("round " + std::to_string(ms_since(t0)) + " " + std::to_string(errors));
    return errors == 0;
  }

  Args a_;
  RankChannel ch_;
  std::vector<SoakParam> params_;
  std::vector<client::ParameterRegistration> regs_;
  std::vector<std::vector<float>> updates_;
  std::unique_ptr<client::Client> client_;
  std::vector<int64_t> next_;
  int64_t target_;
  uint64_t attempt_ = 0;
  bool exit_asked_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"muon_soak_rank: one compute rank of the soak job (run by muon_soak)"};
  app.add_option("--socket", a.socket, "server socket")->required();
  app.add_option("--rank", a.rank)->required();
  app.add_option("--world", a.world)->required();
  app.add_option("--shapes", a.shapes, "parameter set: small or gpt2");
  app.add_option("--target", a.target, "steps of every parameter")->required();
  app.add_option("--op-timeout-ms", a.op_timeout_ms, "client operation timeout");
  app.add_option("--wait-ms", a.wait_ms, "longest wait for a driver command");
  app.add_option("--seed", a.seed, "chunking seed");
  app.add_option("--backward-us", a.backward_us, "sleep spread over each round's pushes");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  RankChannel ch;
  try {
    return SoakRank(a).run();
  } catch (const std::exception& e) {
    try {
      ch.emit("fatal " + one_line(e.what()));
    } catch (...) {
    }
    std::fprintf(stderr, "muon_soak_rank %d: %s\n", a.rank, e.what());
    return 4;
  }
}
