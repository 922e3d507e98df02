// The soak's settings, what it measured, and the verdict: which bounds held, printed for a person
// and written as JSON.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/soak/server_probe.hpp"

namespace muon::soak {

struct SoakConfig {
  int clients = 3;
  int64_t steps = 30;       ///< steps of every parameter; 0 with a duration: until it ends
  int64_t kill_every = 10;  ///< kill after every this many steps; 0: never
  int kill_max = 1;         ///< ranks killed at once: 1..kill_max, at random
  double duration_s = 0;    ///< stop (finish the steps in flight) after this long; 0: none
  std::string shapes = "small";
  double backward_ms = 2;     ///< each rank's pushes of a round are spread over this long
  double hang_s = 60;         ///< bound on every wait; the clients' own timeouts are below it
  int64_t warmup_steps = -1;  ///< RSS samples before this step are warm-up; -1: 2 x kill_every
  double rss_bound_mib = 32;  ///< allowed VmRSS growth after warm-up, MiB ...
  double rss_bound_pct = 10;  ///< ... or this % of the first sample, whichever is larger
  uint32_t tx_slots = 6, rx_slots = 5;  ///< unusual counts: the segment size identifies ours
  uint64_t slot_kib = 0;  ///< 0: a random size per run, so that its segments stand out
  uint64_t seed = 1;
  std::string server_bin, rank_bin, work_dir, json_path;
  /// More flags for the server (--server-arg, repeatable), e.g. --defer-host-copies.
  std::vector<std::string> server_args;
  bool keep = false;
  uint64_t segment_bytes() const { return (uint64_t{tx_slots} + rx_slots) * slot_kib * 1024; }
};

/// One sample of the server's memory.
struct RssSample {
  double t_s = 0;        ///< since the server started
  int64_t progress = 0;  ///< steps completed by every parameter
  MemorySample mem;
  bool steady = false;  ///< every rank connected and stepping
};

/// VmRSS / RssAnon over the steady samples after warm-up.
struct RssFigures {
  int samples = 0;
  int64_t first_kib = 0, peak_kib = 0, last_kib = 0;
  int64_t anon_first_kib = 0, anon_peak_kib = 0, anon_last_kib = 0;
  double slope_kib_per_min = 0;       ///< least squares over time, VmRSS
  double anon_slope_kib_per_min = 0;  ///< same for RssAnon
  double slope_kib_per_100_steps = 0;
  int64_t growth_kib = 0;  ///< last - first, VmRSS
  int64_t bound_kib = 0;
};

RssFigures rss_figures(const std::vector<RssSample>& samples, const SoakConfig& c,
                       int64_t warmup_steps);

struct SoakResult {
  double wall_s = 0;
  int64_t steps_reached = 0;  ///< steps every parameter completed
  int kill_events = 0, ranks_killed = 0, recoveries = 0, unplanned_recoveries = 0;
  int64_t rounds = 0, max_round_ms = 0, max_register_ms = 0, hello_retries = 0;
  std::map<std::string, int64_t> errors_by_code;  ///< step errors the ranks reported
  std::vector<std::string> unexpected;            ///< errors no kill explains, fatal ranks
  std::vector<std::string> hangs;
  std::vector<std::string> rank_failures;  ///< rank processes that exited on their own, non-zero
  int64_t steps_checked = 0;    ///< distinct (parameter, step) compared with the reference
  int64_t updates_checked = 0;  ///< (rank, parameter, step) hashes compared
  int64_t steps_unlogged = 0;   ///< completed steps no rank reported (all receivers were killed)
  std::vector<std::string> mismatches;  ///< against the reference, or between ranks
  std::vector<RssSample> rss;
  RssFigures rss_after_warmup;
  std::optional<MemorySample> rss_after_clients;
  int64_t abandoned_hellos = 0;            ///< hellos whose segment was never mapped (end_checks)
  int64_t segments_seen = 0;               ///< distinct segments of this server seen mapped
  int64_t server_mapped_after = 0;         ///< segments the server still maps once clients are gone
  std::vector<std::string> segments_left;  ///< in /dev/shm once clients are gone
  std::vector<std::string> segments_left_after_exit;  ///< in /dev/shm once the server exited
  /// Segments never seen mapped but of this run's segment size, created during the run, still
  /// there after the server exited: reported, not failed (another process on the machine may
  /// use that size; the soak never leaves a segment unseen: every name it causes is seen).
  std::vector<std::string> segments_same_size;
  std::optional<int> server_exit;
  std::string work_dir;
  std::vector<std::string> failures;  ///< filled by judge()
};

/// Fills `failures` with every bound that did not hold; true when none.
bool judge(SoakResult& r, const SoakConfig& c);
/// The human summary.
std::string summary_text(const SoakResult& r, const SoakConfig& c);
/// Everything, as JSON text.
std::string result_json(const SoakResult& r, const SoakConfig& c);

}  // namespace muon::soak
