#include "tests/soak/soak_driver.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <thread>

#include "tests/soak/rank_channel.hpp"
#include "tests/soak/server_probe.hpp"

namespace muon::soak {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kNoTarget = int64_t{1} << 50;  // --duration without --steps

const char* phase_name(int p) {
  static const char* names[] = {"starting", "registered", "stepping", "recover", "done"};
  return names[p];
}

}  // namespace

SoakDriver::SoakDriver(SoakConfig config)
    : c_(std::move(config)),
      params_(soak_params(c_.shapes)),
      tick_(io_),
      kill_timer_(io_),
      rng_(c_.seed),
      max_logged_(params_.size(), -1) {
  if (c_.clients < 1) throw std::runtime_error("--clients must be at least 1");
  target_ = c_.steps > 0 ? c_.steps : kNoTarget;
  if (c_.steps <= 0 && c_.duration_s <= 0) {
    throw std::runtime_error("give --steps or --duration (or both)");
  }
  next_kill_at_ = c_.kill_every;
  if (c_.slot_kib == 0) {  // a size of its own: 11 x 768..1279 KiB
    std::random_device rd;
    c_.slot_kib = std::uniform_int_distribution<uint64_t>(768, 1279)(rd);
  }
  if (c_.warmup_steps < 0) c_.warmup_steps = c_.kill_every > 0 ? 2 * c_.kill_every : 5;
}

SoakDriver::~SoakDriver() = default;

double SoakDriver::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - t0_).count();
}

std::string SoakDriver::slot_name(const Slot& s) const {
  return "rank " + std::to_string(s.rank) + " (incarnation " + std::to_string(s.incarnation) +
         ", log rank" + std::to_string(s.rank) + "." + std::to_string(s.incarnation) + ".log)";
}

void SoakDriver::note(const std::string& line) {
  char t[32];
  std::snprintf(t, sizeof t, "%9.3f ", elapsed_s());
  events_ << t << line << "\n";
}

// ---- processes ------------------------------------------------------------------------------

void SoakDriver::start_server() {
  socket_ = (fs::path(c_.work_dir) / "soak.sock").string();
  const auto hang_ms = static_cast<int64_t>(c_.hang_s * 1000);
  server_start_wall_s_ = static_cast<int64_t>(std::time(nullptr));
  std::vector<std::string> argv = {
      c_.server_bin, "--socket", socket_, "--backend", "cpu", "--threads", "1", "--log-level",
      "info", "--tx-slots", std::to_string(c_.tx_slots), "--rx-slots",
      std::to_string(c_.rx_slots), "--slot-kib", std::to_string(c_.slot_kib),
      "--step-timeout-ms", std::to_string(hang_ms / 3)};
  argv.insert(argv.end(), c_.server_args.begin(), c_.server_args.end());
  server_ = std::make_unique<ChildProcess>(argv, (fs::path(c_.work_dir) / "server.log").string(),
                                           false);
  t0_ = Clock::now();
  for (;;) {
    const auto s = server_status(socket_, 1s);
    if (!s.empty() && s.front() == '{') return;
    if (server_->poll_exit()) {
      throw std::runtime_error("muon-offloadd exited at start (see " + c_.work_dir +
                               "/server.log): " + s);
    }
    if (Clock::now() - t0_ > 20s) throw std::runtime_error("muon-offloadd not ready: " + s);
    std::this_thread::sleep_for(20ms);
  }
}

void SoakDriver::spawn_rank(int rank) {
  auto s = std::make_shared<Slot>();
  s->rank = rank;
  s->incarnation = incarnations_[rank]++;
  const auto hang_ms = static_cast<int64_t>(c_.hang_s * 1000);
  std::vector<std::string> argv = {c_.rank_bin,
                                   "--socket",
                                   socket_,
                                   "--rank",
                                   std::to_string(rank),
                                   "--world",
                                   std::to_string(c_.clients),
                                   "--shapes",
                                   c_.shapes,
                                   "--target",
                                   std::to_string(target_),
                                   "--op-timeout-ms",
                                   std::to_string(hang_ms / 2),
                                   "--wait-ms",
                                   std::to_string(hang_ms * 10),
                                   "--backward-us",
                                   std::to_string(static_cast<int64_t>(c_.backward_ms * 1000)),
                                   "--seed",
                                   std::to_string(c_.seed * 1000003 + incarnations_[rank])};
  const auto log = fs::path(c_.work_dir) /
                   ("rank" + std::to_string(rank) + "." + std::to_string(s->incarnation) + ".log");
  s->proc = std::make_unique<ChildProcess>(argv, log.string(), true);
  s->out = std::make_unique<asio::posix::stream_descriptor>(io_, s->proc->take_stdout_fd());
  s->last_event = Clock::now();
  slots_[rank] = s;
  note("# start " + slot_name(*s) + " pid " + std::to_string(s->proc->pid()));
  read_more(s);
}

void SoakDriver::read_more(const SlotPtr& s) {
  asio::async_read_until(
      *s->out, asio::dynamic_buffer(s->buf), '\n',
      [this, s](boost::system::error_code ec, size_t n) {
        if (ec) return;  // end of stream: the tick reaps the process
        const std::string line = s->buf.substr(0, n - 1);
        s->buf.erase(0, n);
        if (!s->killed && state_ != State::finished) {
          try {
            on_line(*s, line);
          } catch (const std::exception& e) {  // a malformed event
            r_.unexpected.push_back(slot_name(*s) + ": cannot read '" + line + "': " + e.what());
          }
        }
        read_more(s);
      });
}

// ---- events ---------------------------------------------------------------------------------

void SoakDriver::on_line(Slot& s, const std::string& line) {
  note("r" + std::to_string(s.rank) + "." + std::to_string(s.incarnation) + " " + line);
  s.last_event = Clock::now();
  const auto w = split_words(line, 2);
  const std::string kind = w.empty() ? "" : w[0];
  const std::string rest = w.size() > 1 ? w[1] : "";
  if (kind == "update") {
    on_update(s, line);
  } else if (kind == "segment") {
    segments_.insert(rest);
  } else if (kind == "hello_retry") {
    r_.hello_retries += std::stoll(rest);
  } else if (kind == "registered") {
    s.phase = Phase::registered;
    r_.max_register_ms = std::max<int64_t>(r_.max_register_ms, std::stoll(rest));
  } else if (kind == "round") {
    const auto ms = std::stoll(split_words(rest, 2).at(0));
    ++r_.rounds;
    r_.max_round_ms = std::max<int64_t>(r_.max_round_ms, ms);
    round_ms_avg_ = r_.rounds == 1 ? static_cast<double>(ms) : 0.9 * round_ms_avg_ + 0.1 * ms;
  } else if (kind == "error") {
    on_error(s, line);
  } else if (kind == "recover") {
    s.phase = Phase::recover;
    if (state_ == State::run) {  // no kill explains it: an unexpected error came first
      state_ = State::recover;
      state_since_ = Clock::now();
      ++r_.unplanned_recoveries;
      note("# unplanned recovery started by " + slot_name(s));
    }
  } else if (kind == "done") {
    s.phase = Phase::done;
  } else if (kind == "fatal") {
    r_.unexpected.push_back(slot_name(s) + " gave up: " + rest);
  } else {
    r_.unexpected.push_back(slot_name(s) + " wrote an unknown event: " + line);
  }
}

void SoakDriver::on_update(Slot& s, const std::string& line) {
  const auto w = split_words(line, 4);
  const auto pi = static_cast<size_t>(std::stoull(w.at(1)));
  const int64_t step = std::stoll(w.at(2));
  const uint64_t hash = std::stoull(w.at(3), nullptr, 16);
  auto& by_rank = hashes_[{pi, step}];
  if (auto it = by_rank.find(s.rank); it != by_rank.end() && it->second != hash) {
    r_.mismatches.push_back(slot_name(s) + " received two different updates of '" +
                            params_.at(pi).param.name + "' step " + std::to_string(step));
  }
  by_rank[s.rank] = hash;
  max_logged_.at(pi) = std::max(max_logged_[pi], step);
  s.phase = Phase::stepping;
  reference_->need(furthest() + 1);
  if (const int64_t p = progress(); p > last_sampled_progress_) {
    last_sampled_progress_ = p;
    sample();  // every step, besides every second
  }
  maybe_kill();
}

void SoakDriver::on_error(Slot& s, const std::string& line) {
  const auto w = split_words(line, 6);  // error code param step rank message
  const std::string code = w.size() > 1 ? w[1] : "?";
  ++r_.errors_by_code[code];
  // A lost peer is expected while a recovery is under way (after a kill, or after a rank that
  // had an unexpected error left); anything else is a finding.
  if (!(code == "peer_lost" && state_ == State::recover)) {
    r_.unexpected.push_back(slot_name(s) + ": " + line.substr(6));
  }
}

// ---- the tick: reap, sample, watch, kill, resume, finish -------------------------------------

void SoakDriver::on_tick() {
  reap();
  if (state_ != State::finished) {
    if (Clock::now() - last_sample_ >= 1s) sample();
    watchdog();
  }
  switch (state_) {
    case State::run:
      maybe_finish();
      if (state_ == State::run) maybe_kill();
      break;
    case State::recover:
      maybe_resume();
      break;
    case State::exiting: {
      const bool all_exited = std::all_of(
          slots_.begin(), slots_.end(), [](const SlotPtr& s) { return s->exit_code.has_value(); });
      if (all_exited) state_ = State::finished;
      break;
    }
    case State::finished:
      break;
  }
  if (state_ == State::finished) {
    kill_timer_.cancel();
    boost::system::error_code ignored;
    for (auto& s : slots_) s->out->close(ignored);  // ends the reads: io_.run() returns
    return;
  }
  if (Clock::now() - last_print_ >= 10s) {
    last_print_ = Clock::now();
    const auto m = r_.rss.empty() ? MemorySample{} : r_.rss.back().mem;
    std::printf("soak: %6.0f s  steps %lld  kills %d  server VmRSS %.1f MiB\n", elapsed_s(),
                static_cast<long long>(progress()), r_.kill_events, m.vm_rss_kib / 1024.0);
    std::fflush(stdout);
  }
  tick_.expires_after(50ms);
  tick_.async_wait([this](boost::system::error_code ec) {
    if (!ec) on_tick();
  });
}

void SoakDriver::reap() {
  if (server_->poll_exit() && state_ != State::finished) {
    abort_run("muon-offloadd exited during the soak (code " +
              std::to_string(*server_->poll_exit()) + "; see server.log)");
    return;
  }
  for (auto& s : slots_) {
    if (s->killed || s->exit_code) continue;
    const auto code = s->proc->poll_exit();
    if (!code) continue;
    s->exit_code = code;
    note("# exit " + slot_name(*s) + " code " + std::to_string(*code));
    if (state_ == State::exiting && s->exit_sent && *code == 0) continue;
    r_.rank_failures.push_back(slot_name(*s) + " exited with code " + std::to_string(*code) +
                               " in phase " + phase_name(static_cast<int>(s->phase)));
    if (state_ != State::finished) abort_run(r_.rank_failures.back());
  }
}

void SoakDriver::sample() {
  last_sample_ = Clock::now();
  if (auto m = read_memory(server_->pid())) {
    r_.rss.push_back({elapsed_s(), progress(), *m, state_ == State::run && all_stepping()});
  }
  for (auto& n : mapped_segments(server_->pid())) segments_.insert(n);
}

void SoakDriver::watchdog() {
  const auto hang = std::chrono::duration<double>(c_.hang_s);
  const auto now = Clock::now();
  if (state_ == State::run) {
    for (auto& s : slots_) {
      if (s->phase == Phase::recover || s->phase == Phase::done) continue;
      if (now - s->last_event > hang) {
        r_.hangs.push_back(slot_name(*s) + ": no event for " + std::to_string(c_.hang_s) +
                           " s while " + phase_name(static_cast<int>(s->phase)));
      }
    }
  } else if ((state_ == State::recover || state_ == State::exiting) && now - state_since_ > hang) {
    std::string who;
    for (auto& s : slots_) {
      if (s->killed || s->phase == Phase::recover || s->phase == Phase::done) continue;
      if (state_ == State::exiting && s->exit_code) continue;
      who +=
          (who.empty() ? "" : ", ") + slot_name(*s) + " " + phase_name(static_cast<int>(s->phase));
    }
    r_.hangs.push_back(std::string(state_ == State::recover
                                       ? "recovery: survivors did not get their error and "
                                         "disconnect within "
                                       : "exit: ranks did not exit within ") +
                       std::to_string(c_.hang_s) + " s: " + who);
  }
  if (!r_.hangs.empty()) abort_run(r_.hangs.back());
}

bool SoakDriver::all_stepping() const {
  return std::all_of(slots_.begin(), slots_.end(),
                     [](const SlotPtr& s) { return !s->killed && s->phase == Phase::stepping; });
}

bool SoakDriver::any_done() const {
  return std::any_of(slots_.begin(), slots_.end(),
                     [](const SlotPtr& s) { return s->phase == Phase::done; });
}

int64_t SoakDriver::progress() const {
  int64_t p = kNoTarget;
  for (auto m : max_logged_) p = std::min(p, m + 1);
  return p;
}

int64_t SoakDriver::furthest() const {
  return *std::max_element(max_logged_.begin(), max_logged_.end());
}

void SoakDriver::maybe_kill() {
  if (c_.kill_every <= 0 || state_ != State::run || kill_pending_) return;
  const int64_t p = progress();
  if (p < next_kill_at_ || !all_stepping() || any_done() || p + 2 >= target_) return;
  const int n =
      std::uniform_int_distribution<int>(1, std::max(1, std::min(c_.kill_max, c_.clients)))(rng_);
  std::vector<int> ranks(static_cast<size_t>(c_.clients));
  for (int r = 0; r < c_.clients; ++r) ranks[r] = r;
  std::shuffle(ranks.begin(), ranks.end(), rng_);
  victims_.assign(ranks.begin(), ranks.begin() + n);
  // A random moment within about one round: pushing, committing or waiting.
  const double span_ms = std::max(5.0, 1.5 * round_ms_avg_);
  kill_pending_ = true;
  kill_timer_.expires_after(std::chrono::microseconds(
      static_cast<int64_t>(std::uniform_real_distribution<double>(0, span_ms)(rng_) * 1000)));
  kill_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) kill_now();
  });
}

void SoakDriver::kill_now() {
  kill_pending_ = false;
  const int64_t p = progress();
  if (state_ != State::run || !all_stepping() || any_done() || p + 2 >= target_) return;
  std::string who;
  for (int v : victims_) {
    auto& s = *slots_[v];
    s.proc->signal(SIGKILL);
    s.proc->wait_exit(10s);
    s.killed = true;
    boost::system::error_code ignored;
    s.out->close(ignored);
    who += " " + std::to_string(v);
  }
  note("# kill ranks" + who + " at step " + std::to_string(p));
  ++r_.kill_events;
  r_.ranks_killed += static_cast<int>(victims_.size());
  next_kill_at_ = (p / c_.kill_every + 1) * c_.kill_every;
  state_ = State::recover;
  state_since_ = Clock::now();
}

void SoakDriver::maybe_resume() {
  for (auto& s : slots_) {
    if (!s->killed && s->phase != Phase::recover && s->phase != Phase::done) return;
  }
  // Every survivor is disconnected (or done and waiting): restart the killed, release the rest.
  for (int r = 0; r < c_.clients; ++r) {
    if (slots_[r]->killed) spawn_rank(r);
  }
  for (auto& s : slots_) {
    if (s->phase != Phase::recover) continue;
    s->proc->write_line("go");
    s->phase = Phase::starting;
    s->last_event = Clock::now();
  }
  note("# go");
  ++r_.recoveries;
  state_ = State::run;
}

void SoakDriver::maybe_finish() {
  if (target_ == kNoTarget && c_.duration_s > 0 && elapsed_s() >= c_.duration_s) {
    target_ = furthest() + 3;  // past every step any rank may have pushed
    for (auto& s : slots_) s->proc->write_line("target " + std::to_string(target_));
    note("# target " + std::to_string(target_));
  }
  if (!std::all_of(slots_.begin(), slots_.end(),
                   [](const SlotPtr& s) { return s->phase == Phase::done; })) {
    return;
  }
  for (auto& s : slots_) {
    s->proc->write_line("exit");
    s->exit_sent = true;
  }
  note("# exit");
  state_ = State::exiting;
  state_since_ = Clock::now();
}

void SoakDriver::abort_run(const std::string& why) {
  if (state_ == State::finished) return;
  note("# abort: " + why);
  std::cerr << "soak: aborting: " << why << "\n";
  std::ofstream(fs::path(c_.work_dir) / "status-at-abort.json")
      << server_status(socket_, 5s) << "\n";
  for (auto& s : slots_) {
    if (s->killed || s->exit_code) continue;
    s->proc->signal(SIGKILL);
    s->exit_code = s->proc->wait_exit(10s);
  }
  aborted_ = true;
  state_ = State::finished;
}

// ---- the checks at the end ------------------------------------------------------------------

void SoakDriver::check_updates() {
  const int64_t steps = furthest() + 1;
  std::printf("soak: checking %lld steps against the reference (%lld computed so far)\n",
              static_cast<long long>(steps), static_cast<long long>(reference_->done()));
  std::fflush(stdout);
  reference_->wait(steps);
  for (const auto& [key, by_rank] : hashes_) {
    const auto& [pi, step] = key;
    const uint64_t ref = reference_->hash(pi, step);
    ++r_.steps_checked;
    for (const auto& [rank, h] : by_rank) {
      ++r_.updates_checked;
      if (h != ref) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " (hash %016llx, reference %016llx)",
                      static_cast<unsigned long long>(h), static_cast<unsigned long long>(ref));
        r_.mismatches.push_back("'" + params_[pi].param.name + "' step " + std::to_string(step) +
                                " on rank " + std::to_string(rank) +
                                " differs from the in-process reference" + buf);
      }
    }
  }
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    for (int64_t s = 0; s <= max_logged_[pi]; ++s) r_.steps_unlogged += !hashes_.count({pi, s});
  }
}

std::vector<std::string> SoakDriver::leftover_segments(bool same_size) const {
  std::vector<std::string> out;
  for (const auto& e : list_segments()) {
    // Ours: seen mapped by the server or a rank, or named in a hello_ok. Same size: never seen,
    // but created since the server started, with this run's segment size.
    const bool seen = segments_.count(e.name) != 0;
    const bool size = e.bytes == c_.segment_bytes() && e.ctime_s + 1 >= server_start_wall_s_;
    if (same_size ? (!seen && size) : seen) out.push_back(e.name);
  }
  return out;
}

void SoakDriver::end_checks() {
  const pid_t pid = server_->pid();
  if (!server_->poll_exit()) {
    // Clients that vanish between hello and mapping their segment (a kill during connect).
    try {
      for (int i = 0; i < 10; ++i) {
        const auto name = abandoned_hello(socket_, i % c_.clients, c_.clients, 5s);
        segments_.insert(name);
        ++r_.abandoned_hellos;
        // The next hello of that rank is refused while the server still holds this session.
        const auto until = Clock::now() + 5s;
        auto mapped = [&] {
          const auto m = mapped_segments(pid);
          return std::find(m.begin(), m.end(), name) != m.end();
        };
        while (mapped() && Clock::now() < until) std::this_thread::sleep_for(5ms);
      }
    } catch (const std::exception& e) {
      r_.unexpected.push_back(std::string("abandoned hello: ") + e.what());
    }
    for (auto& n : mapped_segments(pid)) segments_.insert(n);
    const auto until = Clock::now() + 10s;  // the server notices the last sockets closing
    while (!mapped_segments(pid).empty() && Clock::now() < until) std::this_thread::sleep_for(20ms);
    r_.server_mapped_after = static_cast<int64_t>(mapped_segments(pid).size());
    r_.rss_after_clients = read_memory(pid);
  }
  r_.segments_left = leftover_segments();
  server_->signal(SIGTERM);
  r_.server_exit = server_->wait_exit(30s);
  r_.segments_left_after_exit = leftover_segments();
  r_.segments_same_size = leftover_segments(true);
  r_.segments_seen = static_cast<int64_t>(segments_.size());
}

SoakResult SoakDriver::run() {
  if (c_.work_dir.empty()) {
    char tmpl[] = "/tmp/muon-soak-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    c_.work_dir = tmpl;
  }
  fs::create_directories(c_.work_dir);
  r_.work_dir = c_.work_dir;
  events_.open(fs::path(c_.work_dir) / "events.log");
  start_server();
  reference_ = std::make_unique<ReferenceThread>(params_, c_.clients, 1);
  slots_.resize(static_cast<size_t>(c_.clients));
  incarnations_.assign(static_cast<size_t>(c_.clients), 0);
  for (int r = 0; r < c_.clients; ++r) spawn_rank(r);
  last_sample_ = last_print_ = Clock::now();
  sample();
  on_tick();
  io_.run();
  r_.steps_reached = progress() == kNoTarget ? 0 : progress();
  check_updates();  // after an abort too: what was logged must still be right
  end_checks();
  r_.rss_after_warmup = rss_figures(r_.rss, c_, c_.warmup_steps);
  r_.wall_s = elapsed_s();
  slots_.clear();
  reference_.reset();
  judge(r_, c_);
  if (!c_.json_path.empty()) std::ofstream(c_.json_path) << result_json(r_, c_) << "\n";
  std::ofstream(fs::path(c_.work_dir) / "result.json") << result_json(r_, c_) << "\n";
  events_.close();
  if (r_.failures.empty() && !c_.keep) fs::remove_all(c_.work_dir);
  return r_;
}

}  // namespace muon::soak
