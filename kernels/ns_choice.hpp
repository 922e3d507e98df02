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

/// One candidate's time for one block, in seconds (the least of a few calibration runs).
struct NsMeasurement {
  NsAlgorithm algorithm;
  double seconds;
};

/// What `auto` runs and why (one line: times and the rule that decided).
struct NsChoice {
  NsAlgorithm algorithm = NsAlgorithm::plain;
  std::string reason;
};

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
/// A choice, once in the file, is never changed: the first process to need it measures it while
/// holding an exclusive lock on the file (flock on "<path>.lock") and writes it; every later one,
/// in this process or another, reads it. Delete the file to measure again. Thread-safe.
class NsChoiceTable {
 public:
  /// `path` "" keeps the table in memory only.
  explicit NsChoiceTable(std::string path);

  /// The choice for (machine, key): from memory, else from the file, else `measure()` (the
  /// candidates' times, in ns_auto_candidates order) turned into one by choose_ns_algorithm and
  /// stored. `measure` runs under the table's lock: one calibration at a time per process and
  /// per machine. An unreadable or malformed file is an error (InvalidArgument naming it), not a
  /// silent recalibration.
  NsChoice choose(const std::string& machine, const std::string& key,
                  const std::function<std::vector<NsMeasurement>()>& measure);

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

/// Choices as JSON text, [{"machine", "key", "algorithm", "reason"}, ...] (a snapshot's
/// metadata), and back. The reader throws InvalidArgument for malformed text or an algorithm
/// that is not plain, syrk or gram.
std::string ns_choices_to_json(const std::vector<NsChoiceTable::Entry>& choices);
std::vector<NsChoiceTable::Entry> ns_choices_from_json(const std::string& text);

}  // namespace muon
