// The soak driver: one real muon-offloadd, N rank processes (muon_soak_rank) stepping through the
// job, SIGKILL of random ranks every K steps and their restart, and the watch over it all —
// server memory every second, the shared-memory segments it maps and leaves, a watchdog on every
// wait, and the updates' hashes against the in-process reference.
//
// Restart protocol (what a trainer would do, with the server's real rules):
//  1. The driver kills ranks while every rank is stepping; the kill lands at a random moment of a
//     round (pushing, committing or waiting).
//  2. The server drops every step a killed rank had not committed and sends peer_lost to the
//     others; a survivor finishes its round, disconnects (goodbye), reports `recover`.
//  3. Once every survivor has done so (bounded by the hang bound), the driver restarts the killed
//     ranks and tells the survivors `go`: all reconnect with their ranks, re-register (the server
//     answers when all are connected again) and ask the server for each parameter's last applied
//     step; the job resumes with the next one, pushing a dropped step again with its data.
// Nobody is connected between 2 and 3, so no half-gathered step survives a recovery.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/soak/child_process.hpp"
#include "tests/soak/reference_thread.hpp"
#include "tests/soak/soak_result.hpp"

namespace muon::soak {

class SoakDriver {
 public:
  explicit SoakDriver(SoakConfig config);
  ~SoakDriver();

  /// Runs the soak and judges it (SoakResult::failures). Throws std::runtime_error when the
  /// work folder cannot be made or the server does not start.
  SoakResult run();

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { starting, registered, stepping, recover, done };
  enum class State { run, recover, exiting, finished };
  struct Slot {
    int rank = 0, incarnation = 0;
    std::unique_ptr<ChildProcess> proc;
    std::unique_ptr<boost::asio::posix::stream_descriptor> out;
    std::string buf;
    Phase phase = Phase::starting;
    Clock::time_point last_event;
    bool killed = false, exit_sent = false;
    std::optional<int> exit_code;
  };
  using SlotPtr = std::shared_ptr<Slot>;

  void start_server();
  void spawn_rank(int rank);
  void read_more(const SlotPtr& s);
  void on_line(Slot& s, const std::string& line);
  void on_update(Slot& s, const std::string& line);
  void on_error(Slot& s, const std::string& line);
  void on_tick();
  void reap();
  void sample();
  void watchdog();
  void maybe_kill();
  void kill_now();
  void maybe_resume();
  void maybe_finish();
  void abort_run(const std::string& why);
  void check_updates();
  void end_checks();
  std::vector<std::string> leftover_segments(bool same_size = false) const;
  int64_t progress() const;
  int64_t furthest() const;
  bool all_stepping() const;
  bool any_done() const;
  double elapsed_s() const;
  std::string slot_name(const Slot& s) const;
  void note(const std::string& line);

  SoakConfig c_;
  SoakResult r_;
  std::vector<SoakParam> params_;
  boost::asio::io_context io_;
  boost::asio::steady_timer tick_, kill_timer_;
  std::unique_ptr<ChildProcess> server_;
  std::string socket_;
  std::vector<SlotPtr> slots_;  // by rank: the live incarnation
  std::vector<int> incarnations_;
  std::unique_ptr<ReferenceThread> reference_;
  std::ofstream events_;
  std::mt19937_64 rng_;
  State state_ = State::run;
  int64_t target_ = 0;
  int64_t next_kill_at_ = 0;
  bool kill_pending_ = false;
  int64_t last_sampled_progress_ = 0;
  std::vector<int> victims_;
  Clock::time_point t0_, state_since_, last_sample_, last_print_;
  int64_t server_start_wall_s_ = 0;
  double round_ms_avg_ = 0;
  std::map<std::pair<size_t, int64_t>, std::map<int, uint64_t>> hashes_;  // (param, step) -> rank
  std::vector<int64_t> max_logged_;                                       // per parameter
  std::set<std::string> segments_;
  bool aborted_ = false;
};

}  // namespace muon::soak
