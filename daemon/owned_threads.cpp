#include "daemon/owned_threads.hpp"

#include <utility>

namespace muon::daemon {

bool OwnedThreads::start(std::function<void()> work) {
  join_finished();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::lock_guard lock(mu_);
  if (closed_) return false;
  threads_.push_back({std::thread([work = std::move(work), finished] {
                        work();
                        *finished = true;
                      }),
                      finished});
  return true;
}

void OwnedThreads::join_finished() {
  std::vector<Owned> done;
  {
    std::lock_guard lock(mu_);
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (it->finished->load()) {
        done.push_back(std::move(*it));
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : done) t.thread.join();
}

void OwnedThreads::join_all() {
  std::vector<Owned> all;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    all.swap(threads_);
  }
  for (auto& t : all) t.thread.join();
}

}  // namespace muon::daemon
