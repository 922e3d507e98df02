// The compute side of the server: a worker thread that takes parameters whose gradient is
// complete, batches the ready ones of the same shape and options (up to kMaxBatchElements,
// kernels/step_batch.hpp) into one call of its StepRunner (host buffers through the backend,
// or device buffers on the GPU data plane), runs momentum + Newton-Schulz + scale, and hands
// the results back. Work starts the moment a parameter is submitted, so it overlaps the rest of
// the trainers' backward.
//
// The step policy, once for host and device: jobs that cannot share a call run alone; a batched
// call that fails runs each of its jobs alone, so that only the bad one fails and every error
// names its own parameter; a refused step (StepRunner::run threw) leaves the momentum untouched
// (it was stepped in scratch, and never committed) and maps its exception to a code:
// NonFiniteError non_finite, InvalidArgument bad_request, anything else backend; a skipped
// step (policy skip) is committed with applied = false.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error_code.hpp"
#include "daemon/device_plane.hpp"
#include "daemon/numeric_health.hpp"
#include "daemon/step/step_runner.hpp"
#include "kernels/backend.hpp"
#include "kernels/step_batch.hpp"

namespace muon::daemon {

/// One parameter's step, handed to the worker and back.
struct NsJob {
  std::string name;
  int64_t step = 0;
  MatrixShape shape;
  MuonOptions options;
  std::vector<float> grad;     ///< reduced gradient, shape.numel() fp32 (consumed)
  float* momentum = nullptr;   ///< the parameter's fp32 momentum; the caller must not touch it
                               ///< until the job comes back (null for convention none)
  std::vector<float> update;   ///< out: shape.numel() fp32
  bool applied = false;        ///< out: false when skipped by the non-finite policy
  std::string error;           ///< out: non-empty when the backend refused the step (the
                               ///< momentum is then untouched)
  ErrorCode error_code = ErrorCode::none;  ///< out: non_finite, bad_request, backend
  bool sample_health = false;  ///< in: measure the update's numeric health (numeric_health.hpp)
  std::optional<NumericHealth> health;  ///< out: set when sampled and the step was applied
  /// GPU data plane: the parameter's device buffers (grad, momentum and update live there; the
  /// host vectors above stay empty, except when health is sampled: then `update`, `grad` and
  /// `sampled_momentum` hold copies for the check). Null: host job.
  DeviceParamState* device = nullptr;
  std::vector<float> sampled_momentum;  ///< out (device jobs, health sampled): the new momentum
  /// out: seconds of the backend call (momentum + Newton-Schulz + scale) spent on this job; a
  /// batched call is shared among its jobs in proportion to their elements.
  double compute_seconds = 0.0;
};

/// Whether `job`'s options keep a momentum buffer (every convention but none).
inline bool keeps_momentum(const NsJob& job) {
  return job.options.momentum.convention != MomentumConvention::none;
}

/// A single worker thread over one backend.
class Scheduler {
 public:
  /// `on_done` is called on the worker thread with each finished batch of jobs (a batch holds
  /// jobs of equal shape and options that were ready together). One runner call takes at most
  /// `max_batch_elements` elements of them (or one larger job). Jobs run on `runner`, or, when
  /// it is null, on host buffers through `backend` (make_host_step_runner).
  Scheduler(std::unique_ptr<Backend> backend, std::function<void(std::vector<NsJob>)> on_done,
            std::unique_ptr<StepRunner> runner = nullptr,
            int64_t max_batch_elements = kMaxBatchElements);
  ~Scheduler();  ///< stops after the jobs already submitted

  /// Queues a job (thread-safe).
  void submit(NsJob job);
  /// Queues Backend::prepare for a parameter of `shape` and `options` (thread-safe): auto's
  /// calibration of its block shapes runs on the worker before the jobs it finds queued with
  /// it (so before every job submitted after this call), never alongside one (it times the
  /// cores). Errors are left for the first step
  /// to report (it validates the same way, naming its parameter).
  void prepare(std::string name, MatrixShape shape, MuonOptions options);
  /// Finishes queued jobs, then joins the worker. Idempotent.
  void stop();
  /// Jobs waiting (not yet taken by the worker).
  size_t queued() const;
  const Backend& backend() const { return *backend_; }

 private:
  void run();
  /// Jobs of equal rows, cols and options: each alone or in batches of at most
  /// max_batch_elements_ elements (kernels/step_batch.hpp), in submission order.
  void run_group(std::vector<NsJob>& jobs);
  /// One batch of run_group: one StepRunner call; a lone job, or a call that fails, runs alone.
  void run_batch(const std::vector<NsJob*>& batch);
  void run_alone(NsJob& job);
  void sample_health(NsJob& job);  // fills job.health when asked for and applied
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StepRunner> runner_;
  std::function<void(std::vector<NsJob>)> on_done_;
  int64_t max_batch_elements_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<NsJob> queue_;
  struct Prepare {
    std::string name;
    MatrixShape shape;
    MuonOptions options;
  };
  std::deque<Prepare> prepares_;  // run before the queued jobs
  bool stopping_ = false;
  std::thread worker_;
  std::mutex join_mu_;        // serializes stop()'s join
  HealthScratch health_buf_;  // numeric health: Gram matrices and one input block (worker only)
};

/// True when two option sets give bitwise the same math (used to batch jobs together).
bool same_options(const MuonOptions& a, const MuonOptions& b);

}  // namespace muon::daemon
