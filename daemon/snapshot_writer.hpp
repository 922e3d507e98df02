// Snapshots written on a thread of their own, so that the io thread never waits for a disk: the
// io thread copies a consistent set of momenta (one step of every parameter) and hands it over;
// the writer writes each set atomically (write_snapshot) in the order given and posts the outcome
// back.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/snapshot.hpp"

namespace muon::daemon {

class SnapshotWriter {
 public:
  /// The outcome of one write: "" on success, else the error's message (naming the path).
  using Done = std::function<void(const std::string& error)>;
  /// Runs a function on the owner's thread (the io thread): every Done goes through it.
  using Post = std::function<void(std::function<void()>)>;

  explicit SnapshotWriter(Post post);
  /// Writes what is queued (outcomes posted), then joins the thread.
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  /// Queues `entries` for `path`; `done` is posted once the file is in place (or failed).
  void write(std::string path, std::vector<SnapshotEntry> entries, Done done);
  /// Blocks until every write queued so far is on disk (their outcomes posted, maybe not run).
  void drain();
  /// Writes queued or being written: a write counts from write() until its file is in place
  /// (or failed), whether or not the writer thread has picked it up yet.
  size_t outstanding();
  /// The step every entry of the last successful write to `path` held (common_step), -2 when
  /// they differed or nothing was written there yet.
  int64_t step_on_disk(const std::string& path);

 private:
  struct Job {
    std::string path;
    std::vector<SnapshotEntry> entries;
    Done done;
  };
  void run();

  Post post_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::map<std::string, int64_t> on_disk_;  // path -> common_step of its last good write
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace muon::daemon
