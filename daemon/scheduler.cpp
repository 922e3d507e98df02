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

bool all_finite(const std::vector<float>& x) {
  bool ok = true;
  for (float v : x) ok &= is_finite_bits(v);
  return ok;
}

bool keeps_momentum(const NsJob& job) {
  return job.options.momentum.convention != MomentumConvention::none;
}

// Records a refused step: no update, momentum untouched by construction (see run_*).
void fail(NsJob& job, std::string code, std::string message) {
  job.applied = false;
  job.update.clear();
  job.error_code = std::move(code);
  job.error = std::move(message);
}

// Runs `f`, mapping its exceptions onto `job`'s error fields. Returns false when it threw.
template <class F>
bool guarded(NsJob& job, F&& f) {
  try {
    f();
    return true;
  } catch (const NonFiniteError& e) {
    fail(job, "non_finite", e.what());
  } catch (const InvalidArgument& e) {
    fail(job, "bad_request", e.what());
  } catch (const std::exception& e) {
    fail(job, "backend", e.what());
  } catch (...) {
    fail(job, "backend", "parameter '" + job.name + "': unknown exception from the backend");
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
         oa.algorithm == ob.algorithm && oa.precision == ob.precision &&
         oa.nonfinite == ob.nonfinite;
}

Scheduler::Scheduler(std::unique_ptr<Backend> backend,
                     std::function<void(std::vector<NsJob>)> on_done, DevicePlane* device_plane)
    : backend_(std::move(backend)), device_plane_(device_plane), on_done_(std::move(on_done)) {
  if (!backend_) throw InvalidArgument("scheduler: backend is null");
  if (!on_done_) throw InvalidArgument("scheduler: on_done is empty");
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
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      taken.swap(queue_);
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
      run_batch(grp);
      // on_done must not throw: an exception escaping the worker thread terminates the process.
      on_done_(std::move(grp));
    }
  }
}

void Scheduler::run_one(NsJob& job) {
  job.error.clear();
  job.error_code.clear();
  const int64_t n = job.shape.numel();
  if (job.shape.batch <= 0 || job.shape.rows <= 0 || job.shape.cols <= 0 ||
      static_cast<int64_t>(job.grad.size()) != n) {
    fail(job, "bad_request",
         "parameter '" + job.name + "' step " + std::to_string(job.step) + ": gradient holds " +
             std::to_string(job.grad.size()) + " values, shape " + job.shape.str() + " needs " +
             std::to_string(std::max<int64_t>(n, 0)));
    return;
  }
  job.update.resize(static_cast<size_t>(n));
  // The momentum is stepped in a copy and written back only on success: a backend may throw after
  // the momentum step (e.g. an option only detected inside Newton-Schulz), and a refused step must
  // leave the momentum untouched.
  float* momentum = nullptr;
  if (keeps_momentum(job) && job.momentum != nullptr) {
    momentum_buf_.assign(job.momentum, job.momentum + n);
    momentum = momentum_buf_.data();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = guarded(job, [&] {
    job.applied = backend_->muon_update(job.name, job.shape, job.grad.data(), momentum,
                                        job.update.data(), job.options);
  });
  job.compute_seconds = seconds_since(t0);
  if (ok && momentum != nullptr) std::copy(momentum, momentum + n, job.momentum);
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

void Scheduler::run_batch(std::vector<NsJob>& jobs) {
  if (!jobs.empty() && jobs.front().device != nullptr) {  // GPU data plane: each on the device
    for (auto& job : jobs) {
      if (device_plane_ == nullptr) {
        fail(job, "backend", "parameter '" + job.name + "': device job on a host scheduler");
        continue;
      }
      guarded(job, [&] { device_plane_->run(job); });
      sample_health(job);
    }
    return;
  }
  // Jobs that cannot share one backend call run alone: a wrong gradient size or missing momentum
  // (refused alone, without touching other buffers) and a non-finite gradient (its error or skip
  // must not spread to the others: under the skip policy a batched call would zero every update).
  std::vector<NsJob*> batch;
  for (auto& job : jobs) {
    const bool fits = job.shape.batch > 0 && job.shape.rows > 0 && job.shape.cols > 0 &&
                      static_cast<int64_t>(job.grad.size()) == job.shape.numel() &&
                      (!keeps_momentum(job) || job.momentum != nullptr) && all_finite(job.grad);
    if (fits) {
      batch.push_back(&job);
    } else {
      run_one(job);
    }
  }
  if (batch.size() == 1) run_one(*batch.front());
  if (batch.size() <= 1) return;

  // One backend call over the concatenation [sum of batches, rows, cols]. The backend treats each
  // slice independently, so every job gets bitwise what it would get alone.
  const NsJob& first = *batch.front();
  const int64_t slice = first.shape.rows * first.shape.cols;
  int64_t total = 0;
  for (const NsJob* j : batch) total += j->shape.batch;
  const bool momentum = keeps_momentum(first);
  grad_buf_.resize(static_cast<size_t>(total * slice));
  update_buf_.resize(static_cast<size_t>(total * slice));
  momentum_buf_.resize(momentum ? static_cast<size_t>(total * slice) : 0);
  int64_t at = 0;
  for (const NsJob* j : batch) {
    const int64_t n = j->shape.numel();
    std::copy(j->grad.begin(), j->grad.end(), grad_buf_.begin() + at);
    if (momentum) std::copy(j->momentum, j->momentum + n, momentum_buf_.begin() + at);
    at += n;
  }
  const MatrixShape shape{total, first.shape.rows, first.shape.cols};
  const std::string name = first.name + " (+" + std::to_string(batch.size() - 1) + " batched)";
  bool applied = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    applied = backend_->muon_update(name, shape, grad_buf_.data(),
                                    momentum ? momentum_buf_.data() : nullptr, update_buf_.data(),
                                    first.options);
  } catch (...) {
    // Nothing was written to the jobs' buffers yet: run each alone, so that only the bad one
    // fails and every error names its own parameter.
    for (NsJob* j : batch) run_one(*j);
    return;
  }
  const double seconds = seconds_since(t0);
  at = 0;
  for (NsJob* j : batch) {
    const int64_t n = j->shape.numel();
    j->error.clear();
    j->error_code.clear();
    j->applied = applied;
    j->compute_seconds = seconds * static_cast<double>(n) / static_cast<double>(total * slice);
    j->update.assign(update_buf_.begin() + at, update_buf_.begin() + at + n);
    if (momentum)
      std::copy(momentum_buf_.begin() + at, momentum_buf_.begin() + at + n, j->momentum);
    at += n;
    sample_health(*j);
  }
}

}  // namespace muon::daemon
