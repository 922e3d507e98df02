// Forgetting the parameters of finished jobs (--forget-finished-jobs-after): a server that
// outlives its jobs (a sidecar per node) otherwise holds every finished job's momentum until a
// job registers the same names, so a node that runs model after model grows by each one's
// momentum. A job counts as present while any session that registered for it is open: its
// compute ranks, or a relay server that forwards its domain's sums (a pool's owners see only
// relays). What it left is kept for --forget-finished-jobs-after, for a restart that resumes
// (resume_from_server), then erased; a snapshot written before still holds it.
#include <malloc.h>

#include <algorithm>
#include <set>

#include "daemon/engine.hpp"
#include "daemon/log.hpp"
#include "daemon/session.hpp"

namespace muon::daemon {

void Engine::schedule_forgetting() {
  if (config_.forget_after.count() <= 0 || stopping_) return;
  if (!forget_announced_) {
    log()->info("forgetting the parameters of a job {} ms after the last of its sessions left "
                "(--forget-finished-jobs-after)",
                config_.forget_after.count());
    forget_announced_ = true;
  }
  // Often enough that a parameter goes within a quarter of the delay of its time, at most
  // every 30 s: a sweep walks the parameters once.
  const auto every = std::clamp(config_.forget_after / 4, std::chrono::milliseconds(50),
                                std::chrono::milliseconds(30000));
  forget_timer_.expires_after(every);
  forget_timer_.async_wait(
      [this, alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec) {
        if (ec || !alive.lock()) return;
        forget_finished_jobs(std::chrono::steady_clock::now());
        schedule_forgetting();
      });
}

void Engine::note_job_session(const std::string& job, bool present) {
  if (config_.forget_after.count() <= 0) return;
  if (present) {
    job_left_.erase(job);
  } else {
    job_left_[job] = std::chrono::steady_clock::now();  // the next sweep drops it if still present
  }
}

size_t Engine::forget_finished_jobs(std::chrono::steady_clock::time_point now) {
  std::set<std::string> present;
  for (const auto& [id, w] : sessions_) {
    auto s = w.lock();
    if (s && !s->closed() && s->rank >= 0 && s->job) present.insert(*s->job);
  }
  std::set<std::string> held;
  for (const auto& [name, p] : params_) held.insert(p.job);
  for (auto it = job_left_.begin(); it != job_left_.end();) {  // back, or nothing held any more
    it = present.count(it->first) || !held.count(it->first) ? job_left_.erase(it) : std::next(it);
  }
  for (const auto& job : held) {
    if (!present.count(job)) job_left_.emplace(job, now);  // first seen gone: counts from now
  }
  // A device copy still pending may hold a parameter's storage (its continuation runs a poll
  // later): sweep again next time rather than free what it writes.
  if (completions_.pending() > 0) return 0;
  size_t forgotten = 0;
  uint64_t bytes = 0;
  for (auto it = params_.begin(); it != params_.end();) {
    Param& p = it->second;
    auto left = job_left_.find(p.job);
    // Owned parameters only (a relayed one is its owner's to forget), between steps, with no
    // registration answer or replication owed.
    const bool forget = left != job_left_.end() && now - left->second >= config_.forget_after &&
                        p.registered() && p.role && p.role->keeps_momentum_here() &&
                        p.phase() == Phase::idle && p.waiting.empty() && !p.awaiting_buddy;
    if (!forget) {
      ++it;
      continue;
    }
    log()->info("forgetting parameter '{}' of job '{}' (last step {}): none of its sessions "
                "connected for {} ms (--forget-finished-jobs-after)",
                it->first, p.job, p.last_step(), config_.forget_after.count());
    bytes += p.layout ? static_cast<uint64_t>(p.layout->spec.shape.numel()) * sizeof(float) : 0;
    if (p.timer) p.timer->cancel();
    it = params_.erase(it);
    ++forgotten;
  }
  if (forgotten > 0) {
    metrics_.parameters_forgotten(forgotten);
    // The allocator keeps freed blocks below its trim threshold (main.cpp raises it so that
    // steps reuse warm pages): hand the forgotten momentum back to the system now.
    malloc_trim(0);
    log()->info("forgot {} parameter(s), {} bytes of momentum", forgotten, bytes);
  }
  return forgotten;
}

}  // namespace muon::daemon
