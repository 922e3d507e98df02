// Work that waits for something the io thread must not block on (a read-back of device memory
// into page-locked host memory, daemon/step/device_param_storage.cpp): each wait is a `ready`
// test that never blocks (e.g. cudaEventQuery) and a continuation. The owner polls the queue (the
// Engine every kPoll on its io thread, armed by on_pending) and the continuations run there, in
// the order their waits were added. No CUDA and no Asio here, so the CPU tests drive it
// directly. One thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>

namespace muon::daemon {

class CompletionQueue {
 public:
  /// A continuation: `error` null when its wait is over, else what its `ready` threw.
  using Then = std::function<void(std::exception_ptr error)>;
  /// How often the Engine polls while a wait is pending (as Session's gate and slot releases).
  static constexpr std::chrono::microseconds kPoll{20};

  /// `arm` is called whenever a wait is added to an empty queue: the owner then calls poll()
  /// until it returns false (the Engine arms a timer).
  explicit CompletionQueue(std::function<void()> arm = {}) : arm_(std::move(arm)) {}

  /// Queues `then` behind every earlier wait, to run once `ready()` returns true (or throws).
  /// Never runs anything itself, even when `ready` already holds.
  void when(std::function<bool()> ready, Then then);

  /// Runs, oldest first, the continuation of each wait that is over, and stops at the first
  /// that is not: a later wait is not run before an earlier one even if its test holds (copies
  /// on one stream finish in order; callers rely on the order). A continuation may add waits;
  /// they run on a later poll. Returns whether waits remain. Exceptions thrown by a
  /// continuation propagate (the queue stays usable, that wait is gone).
  bool poll();

  /// Blocks on nothing: spins poll() until the queue is empty (shutdown and the rare paths that
  /// may wait, e.g. an unregistration's momentum copy; each `ready` still says when).
  void drain();

  size_t pending() const { return waits_.size(); }

 private:
  struct Wait {
    std::function<bool()> ready;
    Then then;
  };
  std::deque<Wait> waits_;
  std::function<void()> arm_;
  bool polling_ = false;  // inside poll(): waits added by a continuation go on the next poll
};

/// A holder's waits in a CompletionQueue whose continuations run only while the holder lives: a
/// parameter's storage (param_storage.hpp), whose continuations refer to the parameter. A wait
/// whose holder is gone is still polled until it is over (its copy may be in flight), then
/// dropped.
class OwnedCompletions {
 public:
  explicit OwnedCompletions(CompletionQueue& queue) : queue_(queue) {}
  void when(std::function<bool()> ready, CompletionQueue::Then then) {
    queue_.when(std::move(ready), [alive = std::weak_ptr<bool>(alive_),
                                   then = std::move(then)](std::exception_ptr error) {
      if (alive.lock()) then(error);
    });
  }

 private:
  CompletionQueue& queue_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muon::daemon
