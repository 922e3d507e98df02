// Threads a GPU data plane starts and joins, never detached (the NCCL joins and the nccl
// sessions' teardowns, daemon/device_plane.hpp): the finished ones are joined when the next one
// starts, the rest by join_all (~DevicePlane), after which start() refuses (the caller then runs
// the work itself). So none outlives the plane, nor the Engine and io_context that the work's
// callbacks post to.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace muon::daemon {

class OwnedThreads {
 public:
  /// Runs `work` on a new thread; false (nothing started) once join_all ran. Throws what
  /// std::thread throws (no thread to be had).
  bool start(std::function<void()> work);
  /// Joins the threads whose work has returned.
  void join_finished();
  /// Joins every thread (each ends within its own deadline) and refuses new ones.
  void join_all();

 private:
  struct Owned {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::mutex mu_;  // threads_ and closed_
  std::vector<Owned> threads_;
  bool closed_ = false;
};

}  // namespace muon::daemon
