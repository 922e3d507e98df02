#include "daemon/completion_queue.hpp"

#include <thread>
#include <utility>

namespace muon::daemon {

void CompletionQueue::when(std::function<bool()> ready, Then then) {
  const bool was_empty = waits_.empty();
  waits_.push_back({std::move(ready), std::move(then)});
  if (was_empty && !polling_ && arm_) arm_();
}

bool CompletionQueue::poll() {
  // Only the waits queued before this poll: a continuation that adds one is not run by it.
  size_t budget = waits_.size();
  polling_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{polling_};
  while (budget-- > 0 && !waits_.empty()) {
    std::exception_ptr error;
    try {
      if (!waits_.front().ready()) break;
    } catch (...) {
      error = std::current_exception();
    }
    Then then = std::move(waits_.front().then);
    waits_.pop_front();
    then(error);
  }
  return !waits_.empty();
}

void CompletionQueue::drain() {
  while (poll()) std::this_thread::yield();
}

}  // namespace muon::daemon
