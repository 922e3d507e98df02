// Where a batch of same-shape Newton-Schulz jobs runs: host buffers through a Backend (CPU, or
// CUDA with host staging), or device buffers on the GPU data plane (DevicePlane::step_runner).
// The policy around it (which jobs may share a call, what a refusal leaves, how errors map to
// codes) is the Scheduler's, written once for both (daemon/scheduler.hpp).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"

namespace muon::daemon {

struct NsJob;

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  /// Whether `job` may share one call with other jobs of its shape and options: its buffers hold
  /// what its shape says and nothing about it can fail on its own (the host also requires a
  /// finite gradient, so a skip or refusal never spreads). A job that may not runs alone.
  virtual bool batchable(const NsJob& job) const = 0;

  /// One call of momentum + Newton-Schulz + scale over `jobs` (one or more of equal rows, cols
  /// and options, in order: the call sees their concatenation [sum of batches, rows, cols]).
  /// Each job's momentum is stepped in scratch: nothing a job keeps changes before commit().
  /// Returns false when the step was skipped (non-finite input under policy skip; a single job
  /// only: a batch that finds one throws, so that its jobs run alone). Throws NonFiniteError
  /// (policy error; naming the matrix), InvalidArgument (shape, options, buffers that do not
  /// match), DeviceError or Error (the backend failed, Newton-Schulz diverged).
  virtual bool run(std::span<NsJob* const> jobs) = 0;

  /// After a run() that returned: writes each job's stepped momentum into the job's own momentum
  /// and its update into job's update buffer (on the device: the parameter's), and for jobs with
  /// sample_health on device buffers copies of the update, the reduced gradient and the stepped
  /// momentum into job.update, job.grad and job.sampled_momentum on the host (the numeric-health
  /// check reads them; host jobs hold them already). Throws DeviceError.
  virtual void commit(std::span<NsJob* const> jobs) = 0;
};

/// Jobs on host buffers (NsJob::grad, momentum, update) through `backend`, which must outlive
/// the runner and is used from one thread (the worker's).
std::unique_ptr<StepRunner> make_host_step_runner(Backend& backend);

}  // namespace muon::daemon
