// ParamStorage in host memory (param_storage.hpp): every copy to the host is already there,
// so each continuation runs before the call returns.
#include "daemon/scheduler.hpp"
#include "daemon/step/param_storage.hpp"
#include "daemon/step_reducer.hpp"

namespace muon::daemon {
namespace {

class HostParamStorage final : public ParamStorage {
 public:
  std::unique_ptr<ContributionStore> make_contribution_store() override {
    return make_host_contribution_store();
  }
  void reduce(StepReducer& reducer, NsJob& job) override {
    job.grad.resize(static_cast<size_t>(job.shape.numel()));
    reducer.reduce(job.grad.data());
  }
  void reduce_to_host(StepReducer& reducer, std::vector<float>& grad, Done then) override {
    reducer.reduce(grad.data());
    then(nullptr);
  }
  void refresh_momentum(std::vector<float>&, Done then) override { then(nullptr); }
  void write_momentum(int64_t, std::span<const float>) override {}
  void read_update(NsJob& job, HostValues then) override { then(job.update.data(), nullptr); }
  void upload_update(const std::vector<float>&) override {}
  void updates_enqueued() override {}
  DeviceParamState* device_state() override { return nullptr; }
};

}  // namespace

std::unique_ptr<ParamStorage> make_host_param_storage() {
  return std::make_unique<HostParamStorage>();
}

}  // namespace muon::daemon
