// The nccl data plane in a client built without NCCL (no CUDA, or no libnccl/nccl.h next to the
// toolkit): NcclPlane::built() is false, so a Connection refuses data plane nccl before it
// connects; every call throws BackendUnavailable should one be reached anyway.
#include "client/nccl_plane.hpp"
#include "core/error.hpp"

namespace muon::client {

namespace {

[[noreturn]] void unavailable() {
  throw BackendUnavailable(
      "data plane nccl: this client was built without NCCL (rebuild with the CUDA toolkit and "
      "NCCL: libnccl and nccl.h next to the toolkit)");
}

}  // namespace

struct NcclPlane::Impl {};

bool NcclPlane::built() {
  return false;
}
NcclPlane::NcclPlane(const transport::NcclIdBytes&, const transport::NcclIdBytes&, uint64_t,
                     std::chrono::milliseconds) {
  unavailable();
}
NcclPlane::~NcclPlane() = default;
int NcclPlane::device() const {
  unavailable();
}
void NcclPlane::send(const void*, size_t, transport::DType, StreamHandle) {
  unavailable();
}
StreamHandle NcclPlane::push_stream() const {
  return nullptr;
}
void NcclPlane::send_host(const void*, size_t, transport::DType) {
  unavailable();
}
void NcclPlane::enter_reader_thread() {
  unavailable();
}
StreamHandle NcclPlane::reader_stream() const {
  unavailable();
}
void NcclPlane::recv(void*, size_t, transport::DType) {
  unavailable();
}
void NcclPlane::recv_to_host(void*, size_t, transport::DType) {
  unavailable();
}
void NcclPlane::discard(size_t, transport::DType) {
  unavailable();
}
void NcclPlane::synchronize(std::chrono::milliseconds) noexcept {}
void NcclPlane::abort() noexcept {}

}  // namespace muon::client
