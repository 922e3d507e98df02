// The nccl data plane in a build without NCCL (nccl_session.hpp): no session can be opened, so
// the other calls are never reached.
#include "core/error.hpp"
#include "daemon/nccl_session.hpp"

namespace muon::daemon {
namespace {

[[noreturn]] void unavailable() {
  throw BackendUnavailable("data plane nccl: this server was built without NCCL");
}

}  // namespace

class NcclSession {};

std::shared_ptr<NcclSession> open_nccl_session(int) {
  unavailable();
}
std::pair<transport::NcclIdBytes, transport::NcclIdBytes> nccl_session_ids(const NcclSession&) {
  unavailable();
}
int nccl_session_device(const NcclSession&) {
  unavailable();
}
void join_nccl_session(NcclSession&, std::chrono::milliseconds) {
  unavailable();
}
void nccl_receive(NcclSession&, transport::DeviceRing&, uint32_t, int64_t, DType) {
  unavailable();
}
void nccl_stage_update(NcclSession&, transport::DeviceRing&, uint32_t, const float*, int64_t, DType,
                       StreamHandle) {
  unavailable();
}
void nccl_send_slot(NcclSession&, transport::DeviceRing&, uint32_t, size_t, DType) {
  unavailable();
}

}  // namespace muon::daemon
