#include "daemon/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "kernels/elementwise.hpp"

namespace muon::daemon {
namespace {

// Floats compared by bits: equal bits give equal math (and NaN equals itself).
bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}
bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Records a refused step: no update, momentum untouched (never committed).
void fail(NsJob& job, ErrorCode code, std::string message) {
  job.applied = false;
  job.update.clear();
  job.error_code = code;
  job.error = std::move(message);
}

// Runs `f`, mapping its exceptions onto `job`'s error fields. Returns false when it threw.
template <class F>
bool guarded(NsJob& job, F&& f) {
  try {
    f();
    return true;
  } catch (const NonFiniteError& e) {
    fail(job, ErrorCode::non_finite, e.what());
  } catch (const InvalidArgument& e) {
    fail(job, ErrorCode::bad_request, e.what());
  } catch (const std::exception& e) {
    fail(job, ErrorCode::backend, e.what());
  } catch (...) {
    fail(job, ErrorCode::backend,
         "parameter '" + job.name + "': unknown exception from the backend");
  }
  return false;
}

}  // namespace

bool same_options(const MuonOptions& a, const MuonOptions& b) {
  const auto &ma = a.momentum, &mb = b.momentum;
  const auto &oa = a.orthogonalize, &ob = b.orthogonalize;
  return ma.convention == mb.convention && same_bits(ma.mu, mb.mu) && ma.nesterov == mb.nesterov &&
         oa.schedule == ob.schedule && oa.steps == ob.steps &&
         oa.coefficients == ob.coefficients && same_bits(oa.eps, ob.eps) &&
         oa.eps_mode == ob.eps_mode && oa.scale_rule == ob.scale_rule &&
         same_bits(oa.extra_scale, ob.extra_scale) && oa.row_splits == ob.row_splits &&
         oa.algorithm == ob.algorithm && oa.gram_restart == ob.gram_restart &&
         oa.precision == ob.precision &&
         oa.nonfinite == ob.nonfinite;
}

Scheduler::Scheduler(std::unique_ptr<Backend> backend,
                     std::function<void(std::vector<NsJob>)> on_done,
                     std::unique_ptr<StepRunner> runner, int64_t max_batch_elements)
    : backend_(std::move(backend)),
      runner_(std::move(runner)),
      on_done_(std::move(on_done)),
      max_batch_elements_(max_batch_elements) {
  if (!backend_) throw InvalidArgument("scheduler: backend is null");
  if (!on_done_) throw InvalidArgument("scheduler: on_done is empty");
  if (!runner_) runner_ = make_host_step_runner(*backend_);
  worker_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::submit(NsJob job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      throw Error("scheduler: stopped, parameter '" + job.name + "' step " +
                  std::to_string(job.step) + " refused");
    }
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Scheduler::prepare(std::string name, MatrixShape shape, MuonOptions options) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    prepares_.push_back({std::move(name), shape, std::move(options)});
  }
  cv_.notify_one();
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  // Called from on_done (the worker itself): the worker exits after this batch; the destructor
  // (or another thread's stop) joins.
  if (std::this_thread::get_id() == worker_.get_id()) return;
  std::lock_guard lock(join_mu_);
  if (worker_.joinable()) worker_.join();
}

size_t Scheduler::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void Scheduler::run() {
  for (;;) {
    std::deque<NsJob> taken;
    std::deque<Prepare> prepares;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty() || !prepares_.empty(); });
      if (queue_.empty() && prepares_.empty()) return;  // stopping and drained
      prepares.swap(prepares_);
      taken.swap(queue_);
    }
    for (const auto& p : prepares) {
      try {
        backend_->prepare(p.name, p.shape, p.options.orthogonalize);
      } catch (const std::exception&) {
        // The parameter's first step validates the same way and reports it, naming the step.
      }
    }
    // Group by (rows, cols, options), groups in order of first appearance, submission order
    // inside a group.
    std::vector<std::vector<NsJob>> groups;
    for (auto& job : taken) {
      auto g = std::find_if(groups.begin(), groups.end(), [&](const std::vector<NsJob>& grp) {
        const NsJob& f = grp.front();
        return f.shape.rows == job.shape.rows && f.shape.cols == job.shape.cols &&
               same_options(f.options, job.options);
      });
      if (g == groups.end()) {
        groups.emplace_back().push_back(std::move(job));
      } else {
        g->push_back(std::move(job));
      }
    }
    for (auto& grp : groups) {
      run_group(grp);
      // on_done must not throw: an exception escaping the worker thread terminates the process.
      on_done_(std::move(grp));
    }
  }
}

void Scheduler::run_alone(NsJob& job) {
  job.error.clear();
  job.error_code = ErrorCode::none;
  NsJob* one[] = {&job};
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = guarded(job, [&] {
    job.applied = runner_->run(one);
    runner_->commit(one);
  });
  job.compute_seconds = seconds_since(t0);
  if (ok) sample_health(job);
}

void Scheduler::sample_health(NsJob& job) {
  job.health.reset();
  if (!job.sample_health || !job.applied || !job.error.empty()) return;
  // Jobs hold the gradient and the stepped momentum (device jobs: copies made for the sample);
  // the health check rebuilds the Newton-Schulz input from them and judges the update against
  // that input's spectrum. Without them it falls back to the schedule's band.
  const float* momentum = job.momentum != nullptr        ? job.momentum
                          : job.sampled_momentum.empty() ? nullptr
                                                         : job.sampled_momentum.data();
  HealthInput input;
  input.grad = job.grad.empty() ? nullptr : job.grad.data();
  input.momentum = keeps_momentum(job) ? momentum : nullptr;
  input.momentum_options = job.options.momentum;
  const bool have_input = input.grad != nullptr && (!keeps_momentum(job) || momentum != nullptr);
  const Precision asked = job.options.orthogonalize.precision;
  const Precision products =
      asked == Precision::backend_default ? backend_->default_precision() : asked;
  try {
    job.health = measure_numeric_health(job.update.data(), job.shape, job.options.orthogonalize,
                                        products, have_input ? &input : nullptr, health_buf_);
  } catch (const std::exception&) {
    // Options and shape were validated by the backend call that just succeeded; a measurement
    // that still fails is left out rather than failing the step.
  }
}

void Scheduler::run_group(std::vector<NsJob>& jobs) {
  std::vector<NsJob*> batchable;
  for (auto& job : jobs) {
    if (runner_->batchable(job)) {
      batchable.push_back(&job);
    } else {
      run_alone(job);
    }
  }
  // Batches of at most max_batch_elements_ (kernels/step_batch.hpp: a batch's scratch grows
  // with it), in submission order.
  for (size_t first = 0; first < batchable.size();) {
    size_t end = first + 1;
    int64_t total = batchable[first]->shape.numel();
    while (end < batchable.size() &&
           total + batchable[end]->shape.numel() <= max_batch_elements_) {
      total += batchable[end]->shape.numel();
      ++end;
    }
    run_batch(std::vector<NsJob*>(batchable.begin() + static_cast<std::ptrdiff_t>(first),
                                  batchable.begin() + static_cast<std::ptrdiff_t>(end)));
    first = end;
  }
}

void Scheduler::run_batch(const std::vector<NsJob*>& batch) {
  if (batch.size() == 1) {
    run_alone(*batch.front());
    return;
  }
  bool applied = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    applied = runner_->run(batch);
    runner_->commit(batch);
  } catch (...) {
    // Nothing a job keeps was committed: run each alone, so that only the bad one fails and
    // every error names its own parameter.
    for (NsJob* j : batch) run_alone(*j);
    return;
  }
  const double seconds = seconds_since(t0);
  int64_t total = 0;
  for (const NsJob* j : batch) total += j->shape.numel();
  for (NsJob* j : batch) {
    j->error.clear();
    j->error_code = ErrorCode::none;
    j->applied = applied;
    j->compute_seconds =
        seconds * static_cast<double>(j->shape.numel()) / static_cast<double>(total);
    sample_health(*j);
  }
}

}  // namespace muon::daemon
