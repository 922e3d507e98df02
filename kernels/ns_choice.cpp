#include "kernels/ns_choice.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"

namespace muon {
namespace {

using nlohmann::json;

std::string milliseconds(double seconds) {
  char buf[32];
  if (seconds >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.3g s", seconds);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1e3);
  }
  return buf;
}

std::string gflop(double flops) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g GFLOP", flops * 1e-9);
  return buf;
}

constexpr const char* kWhereInstead =
    " (set MUON_OFFLOAD_NS_TABLE to a writable file, or to 'none' to keep auto's choices in "
    "memory, per process)";

// An exclusive flock on `path` for the holder's lifetime (none for ""); creates its folder.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    if (path.empty()) return;
    const std::filesystem::path p(path);
    std::error_code ec;
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw InvalidArgument("Newton-Schulz choice table: cannot open its lock " + path + ": " +
                            std::strerror(errno) + kWhereInstead);
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        throw InvalidArgument("Newton-Schulz choice table: cannot lock " + path + ": " +
                              std::strerror(err) + kWhereInstead);
      }
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

json read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json{{"version", 1}, {"machines", json::object()}};
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("machines") || !j["machines"].is_object()) {
    throw InvalidArgument("Newton-Schulz choice table " + path +
                          " is not a table of choices (delete it to measure again)");
  }
  return j;
}

NsChoice choice_from_json(const std::string& path, const json& j) {
  if (!j.is_object() || !j.contains("algorithm") || !j["algorithm"].is_string()) {
    throw InvalidArgument("Newton-Schulz choice table " + path + ": an entry has no algorithm");
  }
  NsChoice c;
  c.algorithm = parse_ns_algorithm(j["algorithm"].get<std::string>());
  if (c.algorithm == NsAlgorithm::automatic) {
    throw InvalidArgument("Newton-Schulz choice table " + path + ": an entry says auto");
  }
  c.reason = j.value("reason", "");
  if (j.contains("side_by_side")) {
    if (!j["side_by_side"].is_boolean()) {
      throw InvalidArgument("Newton-Schulz choice table " + path +
                            ": an entry's side_by_side is not true or false");
    }
    c.side_by_side = j["side_by_side"].get<bool>();
  }
  c.batch_reason = j.value("batch_reason", "");
  return c;
}

json choice_to_json(const NsChoice& c) {
  return {{"algorithm", ns_algorithm_name(c.algorithm)},
          {"reason", c.reason},
          {"side_by_side", c.side_by_side},
          {"batch_reason", c.batch_reason}};
}

// Writes `j` to `path` atomically (a temporary file renamed over it; FileLock made the folder).
void write_file(const std::string& path, const json& j) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out) throw InvalidArgument("Newton-Schulz choice table: cannot write " + tmp + kWhereInstead);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw InvalidArgument("Newton-Schulz choice table: cannot replace " + path + kWhereInstead);
  }
}

}  // namespace

std::vector<NsAlgorithm> ns_auto_candidates(std::string_view backend, Precision precision,
                                            int gram_restart) {
  std::vector<NsAlgorithm> out{NsAlgorithm::plain};
  if (backend != "cpu" || precision == Precision::torch_bf16) return out;
  out.push_back(NsAlgorithm::syrk);
  if (precision == Precision::fp32 && gram_restart >= 1 && gram_restart <= 2) {
    out.push_back(NsAlgorithm::gram);
  }
  return out;
}

std::vector<double> ns_paired_times(const std::vector<std::vector<double>>& rounds) {
  if (rounds.empty() || rounds.front().empty()) {
    throw InvalidArgument("ns_paired_times: no calibration rounds");
  }
  const size_t count = rounds.front().size();
  double least_first = INFINITY;
  for (const auto& r : rounds) {
    if (r.size() != count) throw InvalidArgument("ns_paired_times: rounds of different lengths");
    for (double t : r) {
      if (!(t > 0.0) || !std::isfinite(t)) {
        throw InvalidArgument("ns_paired_times: a time is not a positive number");
      }
    }
    least_first = std::min(least_first, r.front());
  }
  std::vector<double> out(count);
  std::vector<double> ratios(rounds.size());
  for (size_t c = 0; c < count; ++c) {
    for (size_t r = 0; r < rounds.size(); ++r) ratios[r] = rounds[r][c] / rounds[r].front();
    std::sort(ratios.begin(), ratios.end());
    const size_t h = ratios.size() / 2;
    const double median = ratios.size() % 2 == 1 ? ratios[h] : 0.5 * (ratios[h - 1] + ratios[h]);
    out[c] = least_first * median;
  }
  return out;
}

double ns_model_flops(NsAlgorithm algorithm, int64_t m, int64_t n, int steps, int gram_restart) {
  const double M = static_cast<double>(m), N = static_cast<double>(n);
  switch (algorithm) {
    case NsAlgorithm::syrk:
      return steps * (3 * M * M * N + M * M * M);
    case NsAlgorithm::gram: {
      double flops = 0;
      for (const size_t len : gram_run_lengths(static_cast<size_t>(steps), gram_restart)) {
        flops += 3 * M * M * N + (7.0 * static_cast<double>(len) - 6) * M * M * M;
      }
      return flops;
    }
    case NsAlgorithm::plain:
    case NsAlgorithm::automatic:
      break;
  }
  return steps * (4 * M * M * N + 2 * M * M * M);
}

NsChoice choose_ns_algorithm(std::span<const NsMeasurement> measured) {
  if (measured.empty()) throw InvalidArgument("choose_ns_algorithm: no candidate measured");
  double fastest = INFINITY;
  for (const auto& m : measured) {
    if (!(m.seconds > 0.0) || !std::isfinite(m.seconds)) {
      throw InvalidArgument("choose_ns_algorithm: time of " +
                            std::string(ns_algorithm_name(m.algorithm)) +
                            " is not a positive number");
    }
    fastest = std::min(fastest, m.seconds);
  }
  NsChoice c;
  std::string times;
  bool chosen = false;
  for (const auto& m : measured) {
    if (!chosen && m.seconds <= fastest * (1.0 + kNsTieTolerance)) {
      c.algorithm = m.algorithm;
      chosen = true;
    }
    times += (times.empty() ? "" : ", ") + std::string(ns_algorithm_name(m.algorithm)) + " " +
             (m.modeled ? gflop(m.seconds) : milliseconds(m.seconds));
  }
  if (measured.size() == 1) {
    c.reason = "the only candidate meeting the exactness contract here";
  } else if (measured.front().modeled) {
    c.reason = "fewest products by the flop model (a block this heavy is not timed): " + times;
  } else {
    c.reason = "fastest within 3 % (ties to the earliest of plain, syrk, gram): " + times;
  }
  return c;
}

void choose_ns_batching(const NsBatchMeasurement& m, NsChoice& c) {
  if (m.width < 2) throw InvalidArgument("choose_ns_batching: width below 2");
  for (double t : {m.one_at_a_time, m.side_by_side, m.lone_all_threads, m.lone_one_thread}) {
    if (!(t > 0.0) || !std::isfinite(t)) {
      throw InvalidArgument("choose_ns_batching: a time is not a positive number");
    }
  }
  if (!(m.side_by_side_cores >= 0.0) || !std::isfinite(m.side_by_side_cores)) {
    throw InvalidArgument("choose_ns_batching: side_by_side_cores is not a finite share >= 0");
  }
  const std::string w = std::to_string(m.width);
  if (m.side_by_side_cores > 0.0 && m.side_by_side_cores < kNsFreeCoresShare * m.width) {
    char cores[32];
    std::snprintf(cores, sizeof cores, "%.2f", m.side_by_side_cores);
    c.side_by_side = false;
    c.batch_reason = "one at a time: " + w + " matrices side by side (one BLAS thread each) " +
                     "got " + cores + " of " + w +
                     " cores: other work held them during calibration, so whether a lone " +
                     "matrix gains from " + w +
                     " threads was not measurable (delete the table entry to measure again)";
    return;
  }
  const bool batch_gains = m.side_by_side < m.one_at_a_time * (1.0 - kNsTieTolerance);
  const bool lone_keeps = m.lone_one_thread <= m.lone_all_threads * (1.0 + kNsTieTolerance);
  c.side_by_side = batch_gains && lone_keeps;
  c.batch_reason = std::string(c.side_by_side ? "side by side" : "one at a time") + ": " + w +
                   " matrices side by side (one BLAS thread each) " + milliseconds(m.side_by_side) +
                   ", one at a time on " + w + " threads " + milliseconds(m.one_at_a_time) +
                   "; a lone one on 1 thread " + milliseconds(m.lone_one_thread) + ", on " + w +
                   " " + milliseconds(m.lone_all_threads) +
                   " (side by side needs a 3 % gain and a lone matrix no 3 % slower)";
}

std::string ns_choice_key(Precision precision, int64_t m, int64_t n, int steps,
                          int gram_restart) {
  return std::string(precision_name(precision)) + " " + std::to_string(m) + "x" +
         std::to_string(n) + " steps=" + std::to_string(steps) +
         " restart=" + std::to_string(gram_restart);
}

NsChoiceTable::NsChoiceTable(std::string path) : path_(std::move(path)) {}

NsChoice NsChoiceTable::choose(const std::string& machine, const std::string& key,
                               const std::function<std::vector<NsMeasurement>()>& measure,
                               const BatchMeasure& measure_batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto id = std::make_pair(machine, key);
  if (auto it = known_.find(id); it != known_.end()) return it->second;
  FileLock file_lock(path_.empty() ? "" : path_ + ".lock");
  json table = path_.empty() ? json{} : read_file(path_);
  if (!path_.empty()) {
    const json& machines = table["machines"];
    if (machines.contains(machine) && machines[machine].contains(key)) {
      return known_[id] = choice_from_json(path_, machines[machine][key]);
    }
  }
  const std::vector<NsMeasurement> measured = measure();
  NsChoice c = choose_ns_algorithm(measured);
  std::optional<NsBatchMeasurement> batch;
  if (measure_batch) {
    std::string why_not;
    batch = measure_batch(c.algorithm, why_not);
    if (batch) {
      choose_ns_batching(*batch, c);
    } else {
      c.batch_reason = "one at a time: " + why_not;
    }
  }
  if (!path_.empty()) {
    json seconds = json::object();
    for (const auto& m : measured) seconds[std::string(ns_algorithm_name(m.algorithm))] = m.seconds;
    json entry = choice_to_json(c);
    entry["seconds"] = seconds;
    if (batch) {
      entry["batch_seconds"] = {{"width", batch->width},
                                {"one_at_a_time", batch->one_at_a_time},
                                {"side_by_side", batch->side_by_side},
                                {"lone_all_threads", batch->lone_all_threads},
                                {"lone_one_thread", batch->lone_one_thread}};
    }
    table["machines"][machine][key] = entry;
    write_file(path_, table);
  }
  return known_[id] = c;
}

void NsChoiceTable::adopt(const std::vector<Entry>& choices) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<const Entry*> fresh;
  for (const auto& e : choices) {
    if (known_.emplace(std::make_pair(e.machine, e.key), e.choice).second) fresh.push_back(&e);
  }
  if (path_.empty() || fresh.empty()) return;
  FileLock file_lock(path_ + ".lock");
  json table = read_file(path_);
  bool changed = false;
  for (const Entry* e : fresh) {
    json& machine = table["machines"][e->machine];
    if (machine.contains(e->key)) continue;
    machine[e->key] = choice_to_json(e->choice);
    changed = true;
  }
  if (changed) write_file(path_, table);
}

std::vector<NsChoiceTable::Entry> NsChoiceTable::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> out;
  for (const auto& [id, c] : known_) out.push_back({id.first, id.second, c});
  return out;
}

std::string NsChoiceTable::default_path() {
  if (const char* p = std::getenv("MUON_OFFLOAD_NS_TABLE")) {
    const std::string s(p);
    return s == "none" ? "" : s;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/muon-offload/ns-choices.json";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/muon-offload/ns-choices.json";
  }
  return "";
}

NsChoiceTable& NsChoiceTable::process() {
  static NsChoiceTable table(default_path());
  return table;
}

std::vector<NsChoiceTable::Entry> read_ns_choice_file(const std::string& path) {
  std::vector<NsChoiceTable::Entry> out;
  if (!std::filesystem::exists(path)) return out;
  const json table = read_file(path);
  for (const auto& [machine, keys] : table["machines"].items()) {
    if (!keys.is_object()) continue;
    for (const auto& [key, entry] : keys.items()) {
      out.push_back({machine, key, choice_from_json(path, entry)});
    }
  }
  return out;
}

std::string ns_choices_to_json(const std::vector<NsChoiceTable::Entry>& choices) {
  json a = json::array();
  for (const auto& e : choices) {
    json j = choice_to_json(e.choice);
    j["machine"] = e.machine;
    j["key"] = e.key;
    a.push_back(std::move(j));
  }
  return a.dump();
}

std::vector<NsChoiceTable::Entry> ns_choices_from_json(const std::string& text) {
  const json a = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!a.is_array()) throw InvalidArgument("Newton-Schulz choices: not a JSON array");
  std::vector<NsChoiceTable::Entry> out;
  for (const auto& j : a) {
    if (!j.is_object() || !j.contains("machine") || !j["machine"].is_string() ||
        !j.contains("key") || !j["key"].is_string()) {
      throw InvalidArgument("Newton-Schulz choices: an entry lacks machine or key");
    }
    out.push_back({j["machine"].get<std::string>(), j["key"].get<std::string>(),
                   choice_from_json("(choices)", j)});
  }
  return out;
}

}  // namespace muon
