// The reference run on a background thread of the driver: it computes the update hashes of the
// uninterrupted job step by step, as far as the ranks have got, so that on two cores it overlaps
// with the soak instead of adding its length at the end.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/soak/soak_scenario.hpp"

namespace muon::soak {

class ReferenceThread {
 public:
  /// Starts the thread; see ReferenceRun for the arguments.
  ReferenceThread(std::vector<SoakParam> params, int world, int threads);
  /// Stops after the step in progress and joins.
  ~ReferenceThread();

  /// Asks for at least `steps` steps (it never computes more than asked).
  void need(int64_t steps);
  /// Blocks until `steps` steps are computed. Rethrows what the computation threw.
  void wait(int64_t steps);
  /// Steps computed so far.
  int64_t done() const;
  /// Hash of (parameter index, step); requires step < done().
  uint64_t hash(size_t param, int64_t step) const;

 private:
  void loop();
  ReferenceRun run_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint64_t>> hashes_;  // [step][param]
  int64_t needed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace muon::soak
