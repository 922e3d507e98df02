// ParamStorage in host memory (param_storage.hpp): every copy to the host is already there,
// so each continuation runs before the call returns, or, deferred (--defer-host-copies, for
// tests), a poll of the CompletionQueue later, as on the GPU data plane.
#include <optional>

#include "daemon/completion_queue.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/step/param_storage.hpp"
#include "daemon/step_reducer.hpp"

namespace muon::daemon {
namespace {

class HostParamStorage final : public ParamStorage {
 public:
  explicit HostParamStorage(CompletionQueue* deferred) {
    if (deferred != nullptr) deferred_.emplace(*deferred);
  }

  std::unique_ptr<ContributionStore> make_contribution_store() override {
    return make_host_contribution_store();
  }
  void reduce(StepReducer& reducer, NsJob& job) override {
    job.grad.resize(static_cast<size_t>(job.shape.numel()));
    reducer.reduce(job.grad.data());
  }
  void reduce_to_host(StepReducer& reducer, std::vector<float>& grad, Done then) override {
    reducer.reduce(grad.data());
    finish(std::move(then));
  }
  void refresh_momentum(std::vector<float>&, Done then) override { finish(std::move(then)); }
  void write_momentum(int64_t, std::span<const float>) override {}
  void read_update(NsJob& job, HostValues then) override {
    if (!deferred_) {
      then(job.update.data(), nullptr);
      return;
    }
    // The job may be gone a poll later (the device's read-back has a block of its own too).
    auto copy = std::make_shared<std::vector<float>>(job.update);
    finish([copy, then = std::move(then)](std::exception_ptr e) { then(copy->data(), e); });
  }
  void upload_update(const std::vector<float>&) override {}
  void updates_enqueued() override {}
  DeviceParamState* device_state() override { return nullptr; }

 private:
  void finish(Done then) {
    if (!deferred_) {
      then(nullptr);
      return;
    }
    deferred_->when([] { return true; }, std::move(then));
  }
  std::optional<OwnedCompletions> deferred_;
};

}  // namespace

std::unique_ptr<ParamStorage> make_host_param_storage(CompletionQueue* deferred) {
  return std::make_unique<HostParamStorage>(deferred);
}

}  // namespace muon::daemon
