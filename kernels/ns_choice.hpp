// NsAlgorithm::automatic: which of plain, syrk and gram runs a block, and why. The choice is a
// pure function of measured times (choose_ns_algorithm) over the candidates that meet the
// exactness contract (ns_auto_candidates); the times are measured once per machine, shape and
// options and kept in a table file (NsChoiceTable), so every process on the machine (the server,
// the in-process reference, a restarted server) reads the same choice and computes the same bits.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/muon_options.hpp"

namespace muon {

/// The algorithms `auto` may pick on `backend` ("cpu", "cuda", ...) for `precision` (resolved:
/// never backend_default) and `gram_restart`, in tie-break order (plain, syrk, gram: the first
/// is the simplest). The exactness contract: each candidate lands within 2x of plain's error
/// from the SVD oracle (tests/kernels/test_newton_schulz_cpu.cpp):
///   plain  always.
///   syrk   on the CPU (on CUDA it runs the plain GEMMs: nothing to choose), not for torch_bf16
///          (which rounds torch's three products).
///   gram   on the CPU in fp32 with gram_restart 1 or 2 (measured within 2x; 0 = no restart is
///          up to 800x worse, 3 up to 4.3x). Not on CUDA until measured on a GPU
///          (scripts/gpu_check.sh), not in bf16.
std::vector<NsAlgorithm> ns_auto_candidates(std::string_view backend, Precision precision,
                                            int gram_restart);

/// One candidate's time for one block, in seconds (ns_paired_times over a few calibration
/// rounds), or, `modeled`, its ns_model_flops (blocks too heavy to time at start-up).
struct NsMeasurement {
  NsAlgorithm algorithm;
  double seconds;
  bool modeled = false;
};

/// Calibration rounds of ns_paired_times (odd: a median of that many ratios), after a warm-up.
inline constexpr int kNsCalibrationRounds = 5;

/// The candidates' times from `rounds[r][c]`, the seconds of candidate c in round r (each round
/// times every candidate once, back to back): the least time of candidate 0 (plain) times the
/// median over rounds of candidate c's time over candidate 0's in the same round. On a loaded
/// machine two runs back to back see about the same load, so their ratio is steadier than the
/// least times (measured 2026-12-02 on 2 shared cores: gram 230 ms against syrk 236 ms by least
/// times for a 768x2304 block whose gram runs ~20 % faster than syrk in the benchmark). Pure.
/// Throws InvalidArgument for no rounds, rounds of different lengths or a time that is not
/// finite and positive.
std::vector<double> ns_paired_times(const std::vector<std::vector<double>>& rounds);

/// The products one block's Newton-Schulz runs, in GEMM-equivalent flops (an ssyrk counted at
/// its own m^2 k, half of the sgemm it replaces), for the wide m x n block:
///   plain  steps * (4 m^2 n + 2 m^3)
///   syrk   steps * (3 m^2 n + m^3)
///   gram   per run of L steps (runs of gram_restart, 0 = one run): 3 m^2 n + (7 L - 6) m^3
/// (cpu_backend.cpp). The choice for blocks above kNsTimedFlops follows it: on the heavy shapes
/// measured (4096x4096, 4096x14336, 14336x4096 on 2 cores) it picks what the timings picked.
double ns_model_flops(NsAlgorithm algorithm, int64_t m, int64_t n, int steps, int gram_restart);

/// Blocks above this many nominal flops (steps * (4 m^2 n + 2 m^3)) are chosen for by
/// ns_model_flops instead of timed: timing plain, syrk and gram on a 4096 x 14336 block takes
/// minutes on 2 cores, which the server's start would wait for.
inline constexpr double kNsTimedFlops = 2e11;

/// What `auto` runs and why (one line each: times and the rule that decided).
///   side_by_side: every matrix of the block shape runs on one BLAS thread, as many matrices at
///   once as the BLAS had threads (Backend::side_by_side_width), instead of one matrix at a time
///   on all of them. It holds for a lone matrix too: OpenBLAS 0.3.21's products differ in their
///   last bits between 1 and 2 threads (sgemm and ssyrk, any size above its threading threshold),
///   so a matrix's bits must not depend on how many of its shape were ready together.
struct NsChoice {
  NsAlgorithm algorithm = NsAlgorithm::plain;
  std::string reason;
  bool side_by_side = false;
  std::string batch_reason;  ///< why side_by_side is what it is ("" in files from before it)
};

/// The times of `width` same-shape matrices run one at a time on all `width` BLAS threads and
/// side by side (one thread each), and of a lone matrix on all threads and on one, in seconds
/// (the least of a few calibration runs).
struct NsBatchMeasurement {
  int width = 1;
  double one_at_a_time = 0.0;
  double side_by_side = 0.0;
  double lone_all_threads = 0.0;
  double lone_one_thread = 0.0;
  /// The process' CPU seconds over wall seconds while `width` matrices ran side by side: about
  /// `width` when each thread had a core to itself, less when other work held the cores (then
  /// the lone matrix's two times say nothing about what its threads gain on this machine).
  /// 0 = not measured (taken as free cores).
  double side_by_side_cores = 0.0;
};

/// The share of `width` cores the side-by-side rounds must have had (side_by_side_cores /
/// width) for the batching times to be judged: below it the calibration ran on a contended
/// machine and batching stays one at a time.
inline constexpr double kNsFreeCoresShare = 0.85;

/// Side by side only when it beats one at a time by more than kNsTieTolerance (a tie keeps the
/// simpler one at a time) and a lone matrix on one thread is within kNsTieTolerance of one on all
/// threads: side by side also holds for a matrix that finds no other of its shape ready (its
/// bits may not depend on that), so it must not slow that one down (in practice: blocks too
/// small for OpenBLAS to gain from its threads). On a contended calibration (side_by_side_cores
/// below kNsFreeCoresShare of the width) both tests would read a busy machine's times, where a
/// lone matrix gains nothing from threads it cannot run, and the choice would stay in the table
/// once the cores are free: one at a time then, saying so. The reason gives the times. Pure. Throws
/// InvalidArgument for a width below 2 or a time that is not finite and positive.
void choose_ns_batching(const NsBatchMeasurement& measured, NsChoice& choice);

/// Times within this fraction of the fastest count as a tie; ties go to the earliest candidate
/// (plain, syrk, gram), so measurement noise between near-equal algorithms cannot flip a choice
/// toward the less simple one.
inline constexpr double kNsTieTolerance = 0.03;

/// The choice from `measured` (the candidates' times, in ns_auto_candidates order; must not be
/// empty): the earliest candidate whose time is within kNsTieTolerance of the fastest. Pure and
/// deterministic: the same table gives the same choice. Throws InvalidArgument when `measured`
/// is empty or a time is not finite and positive.
NsChoice choose_ns_algorithm(std::span<const NsMeasurement> measured);

/// What a choice depends on besides the machine: the wide block m x n (rows <= cols), the
/// resolved precision, the step count and gram's restart interval. "fp32 768x3072 steps=5
/// restart=2".
std::string ns_choice_key(Precision precision, int64_t m, int64_t n, int steps, int gram_restart);

/// The table of choices: machine key (Backend::machine_key()) -> choice key -> choice, kept in
/// memory and in a JSON file shared by the processes of a machine:
///   {"version": 1, "machines": {"<machine>": {"<key>": {"algorithm": "syrk",
///    "reason": "...", "seconds": {"plain": 0.012, "syrk": 0.010, "gram": 0.011}}}}}
///    "side_by_side": false, "batch_reason": "...",
///    "batch_seconds": {"width": 2, "one_at_a_time": 0.024, "side_by_side": 0.023}}}}}
/// A choice, once in the file, is never changed: the first process to need it measures it while
/// holding an exclusive lock on the file (flock on "<path>.lock") and writes it; every later one,
/// in this process or another, reads it. An entry without "side_by_side" (written before
/// batching was measured) runs one matrix at a time, as it did when written. Delete the file to
/// measure again. Thread-safe.
class NsChoiceTable {
 public:
  /// `path` "" keeps the table in memory only.
  explicit NsChoiceTable(std::string path);

  /// How a new choice's batching is measured: the times for the chosen algorithm, or nullopt
  /// when nothing can run side by side here (one BLAS thread, a GPU, a block too heavy to
  /// measure twice); the string says why then.
  using BatchMeasure =
      std::function<std::optional<NsBatchMeasurement>(NsAlgorithm, std::string& why_not)>;

  /// The choice for (machine, key): from memory, else from the file, else `measure()` (the
  /// candidates' times, in ns_auto_candidates order) turned into one by choose_ns_algorithm,
  /// then `measure_batch` (when given) for the chosen algorithm through choose_ns_batching, and
  /// stored. The measurements run under the table's lock: one calibration at a time per process
  /// and per machine. An unreadable or malformed file is an error (InvalidArgument naming it),
  /// not a silent recalibration.
  NsChoice choose(const std::string& machine, const std::string& key,
                  const std::function<std::vector<NsMeasurement>()>& measure,
                  const BatchMeasure& measure_batch = nullptr);

  /// Every choice this process has made or read, as (machine, key, choice).
  struct Entry {
    std::string machine, key;
    NsChoice choice;
  };
  std::vector<Entry> entries() const;

  /// Takes choices made before (a restored snapshot's): each one this process has not made yet
  /// becomes this process' choice for its (machine, key), and is written to the file where the
  /// file has none for it, so the other processes of the machine (the in-process reference) read
  /// it too. A choice the file holds otherwise stays in the file (never changed); this process
  /// still runs the adopted one. Throws InvalidArgument for a malformed file.
  void adopt(const std::vector<Entry>& choices);

  const std::string& path() const { return path_; }

  /// The process' table: at $MUON_OFFLOAD_NS_TABLE when set ("" or "none": memory only), else
  /// ${XDG_CACHE_HOME:-$HOME/.cache}/muon-offload/ns-choices.json (memory only without HOME).
  static NsChoiceTable& process();
  /// The file process() uses, per the environment above ("" when memory only).
  static std::string default_path();

 private:
  std::string path_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, NsChoice> known_;
};

/// The choices in the table file at `path` (every machine), in file order; empty when the file
/// does not exist. For `muon-offload schedules`. Throws InvalidArgument for a malformed file.
std::vector<NsChoiceTable::Entry> read_ns_choice_file(const std::string& path);

/// Choices as JSON text, [{"machine", "key", "algorithm", "reason", "side_by_side",
/// "batch_reason"}, ...] (a snapshot's metadata), and back (side_by_side false where absent: a
/// snapshot from before batching ran one matrix at a time). The reader throws InvalidArgument for malformed text or an algorithm
/// that is not plain, syrk or gram.
std::string ns_choices_to_json(const std::vector<NsChoiceTable::Entry>& choices);
std::vector<NsChoiceTable::Entry> ns_choices_from_json(const std::string& text);

}  // namespace muon
