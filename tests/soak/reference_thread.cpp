#include "tests/soak/reference_thread.hpp"

namespace muon::soak {

ReferenceThread::ReferenceThread(std::vector<SoakParam> params, int world, int threads)
    : run_(std::move(params), world, threads), thread_([this] { loop(); }) {}

ReferenceThread::~ReferenceThread() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReferenceThread::need(int64_t steps) {
  {
    std::lock_guard lk(mu_);
    if (steps <= needed_) return;
    needed_ = steps;
  }
  cv_.notify_all();
}

void ReferenceThread::wait(int64_t steps) {
  need(steps);
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return static_cast<int64_t>(hashes_.size()) >= steps || error_; });
  if (error_) std::rethrow_exception(error_);
}

int64_t ReferenceThread::done() const {
  std::lock_guard lk(mu_);
  return static_cast<int64_t>(hashes_.size());
}

uint64_t ReferenceThread::hash(size_t param, int64_t step) const {
  std::lock_guard lk(mu_);
  return hashes_.at(static_cast<size_t>(step)).at(param);
}

void ReferenceThread::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || static_cast<int64_t>(hashes_.size()) < needed_; });
      if (stop_) return;
    }
    try {
      auto h = run_.next_step();  // outside the lock: seconds for the gpt2 set
      std::lock_guard lk(mu_);
      hashes_.push_back(std::move(h));
    } catch (...) {
      std::lock_guard lk(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    cv_.notify_all();
  }
}

}  // namespace muon::soak
