// StepRunner on host buffers (step_runner.hpp): one Backend::muon_update per call over the jobs'
// concatenated gradients and momenta. The backend treats each matrix of a batch on its own, so
// every job gets bitwise what it would get alone.
#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/step/step_runner.hpp"
#include "kernels/elementwise.hpp"

namespace muon::daemon {
namespace {

bool all_finite(const std::vector<float>& x) {
  bool ok = true;
  for (float v : x) ok &= is_finite_bits(v);
  return ok;
}

bool sized(const NsJob& job) {
  return job.shape.batch > 0 && job.shape.rows > 0 && job.shape.cols > 0 &&
         static_cast<int64_t>(job.grad.size()) == job.shape.numel();
}

class HostStepRunner final : public StepRunner {
 public:
  explicit HostStepRunner(Backend& backend) : backend_(backend) {}

  bool batchable(const NsJob& job) const override {
    return sized(job) && (!keeps_momentum(job) || job.momentum != nullptr) && all_finite(job.grad);
  }

  bool run(std::span<NsJob* const> jobs) override {
    for (const NsJob* j : jobs) {
      if (!sized(*j)) {
        throw InvalidArgument("parameter '" + j->name + "' step " + std::to_string(j->step) +
                              ": gradient holds " + std::to_string(j->grad.size()) +
                              " values, shape " + j->shape.str() + " needs " +
                              std::to_string(std::max<int64_t>(j->shape.numel(), 0)));
      }
    }
    const NsJob& first = *jobs.front();
    const bool momentum = keeps_momentum(first) && first.momentum != nullptr;
    if (jobs.size() == 1) {  // the job's own gradient and update; the momentum in scratch
      NsJob& job = *jobs.front();
      job.update.resize(static_cast<size_t>(job.shape.numel()));
      if (momentum) momentum_.assign(job.momentum, job.momentum + job.shape.numel());
      return backend_.muon_update(job.name, job.shape, job.grad.data(),
                                  momentum ? momentum_.data() : nullptr, job.update.data(),
                                  job.options);
    }
    const int64_t slice = first.shape.rows * first.shape.cols;
    int64_t total = 0;
    for (const NsJob* j : jobs) total += j->shape.batch;
    grad_.resize(static_cast<size_t>(total * slice));
    update_.resize(static_cast<size_t>(total * slice));
    momentum_.resize(momentum ? static_cast<size_t>(total * slice) : 0);
    int64_t at = 0;
    for (const NsJob* j : jobs) {
      std::copy(j->grad.begin(), j->grad.end(), grad_.begin() + at);
      if (momentum) std::copy(j->momentum, j->momentum + j->shape.numel(), momentum_.begin() + at);
      at += j->shape.numel();
    }
    const MatrixShape shape{total, first.shape.rows, first.shape.cols};
    const std::string name = first.name + " (+" + std::to_string(jobs.size() - 1) + " batched)";
    return backend_.muon_update(name, shape, grad_.data(), momentum ? momentum_.data() : nullptr,
                                update_.data(), first.options);
  }

  void commit(std::span<NsJob* const> jobs) override {
    const bool batched = jobs.size() > 1;
    int64_t at = 0;
    for (NsJob* j : jobs) {
      const int64_t n = j->shape.numel();
      if (batched) j->update.assign(update_.begin() + at, update_.begin() + at + n);
      if (keeps_momentum(*j) && j->momentum != nullptr) {
        std::copy(momentum_.begin() + at, momentum_.begin() + at + n, j->momentum);
      }
      at += n;
    }
  }

 private:
  Backend& backend_;
  // Reused across calls: concatenated gradients, momenta (the scratch every call steps) and
  // updates.
  std::vector<float> grad_, momentum_, update_;
};

}  // namespace

std::unique_ptr<StepRunner> make_host_step_runner(Backend& backend) {
  return std::make_unique<HostStepRunner>(backend);
}

}  // namespace muon::daemon
