#include "daemon/snapshot_writer.hpp"

#include "core/error.hpp"

namespace muon::daemon {

SnapshotWriter::SnapshotWriter(Post post) : post_(std::move(post)), thread_([this] { run(); }) {}

SnapshotWriter::~SnapshotWriter() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SnapshotWriter::write(std::string path, std::vector<SnapshotEntry> entries, Done done) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back({std::move(path), std::move(entries), std::move(done)});
  }
  cv_.notify_all();
}

void SnapshotWriter::drain() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

size_t SnapshotWriter::outstanding() {
  std::lock_guard lk(mu_);
  return queue_.size() + (busy_ ? 1 : 0);
}

int64_t SnapshotWriter::step_on_disk(const std::string& path) {
  std::lock_guard lk(mu_);
  auto it = on_disk_.find(path);
  return it == on_disk_.end() ? -2 : it->second;
}

void SnapshotWriter::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is written
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    std::string error;
    int64_t step = -2;
    try {
      // With the choices auto made (kernels/ns_choice.hpp; the table is thread-safe).
      write_snapshot(job.path, job.entries, NsChoiceTable::process().entries());
      step = common_step(job.entries);
    } catch (const Error& e) {
      error = e.message();
    } catch (const std::exception& e) {
      error = "snapshot '" + job.path + "': " + e.what();
    }
    job.entries.clear();  // the copies' memory goes back before the next job
    if (job.done) post_([done = std::move(job.done), error] { done(error); });
    lk.lock();
    if (error.empty()) on_disk_[job.path] = step;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace muon::daemon
