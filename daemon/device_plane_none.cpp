// The GPU data plane in a build without CUDA: it cannot be created (device_plane.hpp).
#include "core/error.hpp"
#include "daemon/device_plane.hpp"
#include "daemon/step/param_storage.hpp"
#include "daemon/step/step_runner.hpp"

namespace muon::daemon {

class DeviceParamState {};
class DeviceSessionRings {};

struct DevicePlane::Impl {};

void DeviceParamStateDeleter::operator()(DeviceParamState* p) const noexcept {
  delete p;
}
void DeviceSessionRingsDeleter::operator()(DeviceSessionRings* p) const noexcept {
  delete p;
}

namespace {
[[noreturn]] void unavailable() {
  throw BackendUnavailable("GPU data plane: this server was built without CUDA");
}
}  // namespace

DevicePlane::DevicePlane(const DevicePlaneConfig& config) : config_(config) {
  unavailable();
}
DevicePlane::~DevicePlane() = default;
DeviceParamPtr DevicePlane::make_param(int64_t, bool) {
  unavailable();
}
std::unique_ptr<ParamStorage> DevicePlane::make_storage(int64_t, bool, CompletionQueue&) {
  unavailable();
}
std::unique_ptr<ContributionStore> DevicePlane::make_contribution_store() {
  unavailable();
}
void DevicePlane::reduce(StepReducer&, DeviceParamState&) {
  unavailable();
}
void DevicePlane::read_momentum(const DeviceParamState&, int64_t, int64_t, float*) {
  unavailable();
}
void DevicePlane::write_momentum(DeviceParamState&, int64_t, const float*, int64_t) {
  unavailable();
}
void DevicePlane::copy_blocking(void*, const void*, int64_t) {
  unavailable();
}
void DevicePlane::read_update(const DeviceParamState&, int64_t, int64_t, float*) {
  unavailable();
}
std::shared_ptr<float> DevicePlane::pinned(int64_t) {
  unavailable();
}
DevicePlane::CopyDone DevicePlane::copy_async(void*, const void*, int64_t, StreamHandle) {
  unavailable();
}
DevicePlane::CopyDone DevicePlane::read_momentum_async(const DeviceParamState&, float*) {
  unavailable();
}
DevicePlane::CopyDone DevicePlane::write_momentum_async(DeviceParamState&, int64_t, const float*,
                                                        int64_t) {
  unavailable();
}
DevicePlane::CopyDone DevicePlane::read_grad_async(const DeviceParamState&, float*) {
  unavailable();
}
DevicePlane::CopyDone DevicePlane::read_update_async(const DeviceParamState&, float*) {
  unavailable();
}
DevicePlane::CopyDone DevicePlane::write_update_async(DeviceParamState&, const float*) {
  unavailable();
}
uint64_t DevicePlane::host_copy_fence() const {
  unavailable();
}
bool DevicePlane::host_copies_done(uint64_t) {
  unavailable();
}
void DevicePlane::wait_host_copies(uint64_t) {
  unavailable();
}
std::unique_ptr<StepRunner> DevicePlane::step_runner() {
  unavailable();
}
DeviceRingsPtr DevicePlane::make_session_rings(uint32_t, uint32_t, uint64_t) {
  unavailable();
}
const transport::DeviceRingDescriptor& DevicePlane::tx_descriptor(const DeviceSessionRings&) {
  unavailable();
}
const transport::DeviceRingDescriptor& DevicePlane::rx_descriptor(const DeviceSessionRings&) {
  unavailable();
}
Contribution DevicePlane::begin_receive(DeviceSessionRings&, uint32_t, int64_t, transport::DType) {
  unavailable();
}
void DevicePlane::end_receive(DeviceSessionRings&, uint32_t) {
  unavailable();
}
bool DevicePlane::tx_slot_written(const DeviceSessionRings&, uint32_t) {
  unavailable();
}
bool DevicePlane::rx_slot_read(const DeviceSessionRings&, uint32_t) {
  unavailable();
}
void DevicePlane::read_tx_slot(DeviceSessionRings&, uint32_t, void*, size_t) {
  unavailable();
}
DevicePlane::SlotSend DevicePlane::send_update(DeviceSessionRings&, uint32_t,
                                               const DeviceParamState&, int64_t, int64_t,
                                               transport::DType) {
  unavailable();
}
DevicePlane::SlotSend DevicePlane::send_host(DeviceSessionRings&, uint32_t, const void*, size_t,
                                             transport::DType) {
  unavailable();
}
DeviceRingsPtr DevicePlane::make_nccl_session(uint32_t, uint32_t, uint64_t) {
  unavailable();
}
std::pair<transport::NcclIdBytes, transport::NcclIdBytes> DevicePlane::nccl_ids(
    const DeviceSessionRings&) {
  unavailable();
}
void DevicePlane::join_nccl(const DeviceRingsPtr&, std::chrono::milliseconds,
                            std::function<void(const std::string&)>) {
  unavailable();
}
void DevicePlane::updates_enqueued(DeviceParamState&) {
  unavailable();
}

}  // namespace muon::daemon
