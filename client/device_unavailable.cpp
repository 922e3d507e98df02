// The device data plane in a client built without CUDA: every entry point throws
// BackendUnavailable, so that -DMUON_OFFLOAD_CUDA=OFF builds link and say why at run time.
#include "client/device_copy.hpp"
#include "client/device_hold.hpp"
#include "client/device_rings.hpp"
#include "client/device_scope.hpp"
#include "core/error.hpp"

namespace muon::client {

namespace {

[[noreturn]] void unavailable(const char* what) {
  throw BackendUnavailable(std::string(what) +
                           ": this client was built without CUDA (rebuild with "
                           "-DMUON_OFFLOAD_CUDA=ON on a machine with the CUDA toolkit)");
}

}  // namespace

bool built_with_cuda() {
  return false;
}

void require_device_memory(const void*, const std::string& what) {
  unavailable(what.c_str());
}

void copy_device_to_host(void*, const void*, size_t, StreamHandle) {
  unavailable("device to host copy");
}

void copy_host_to_device(void*, const void*, size_t, StreamHandle) {
  unavailable("host to device copy");
}

DeviceScope::DeviceScope(int) {
  unavailable("device scope");
}
DeviceScope::~DeviceScope() = default;

void require_stream_on_device(StreamHandle, int, int, const std::string& what) {
  unavailable(what.c_str());
}

struct DeviceRings::Impl {};

DeviceRings::DeviceRings(const transport::DeviceRingDescriptor&,
                         const transport::DeviceRingDescriptor&) {
  unavailable("data plane cuda_ipc");
}
DeviceRings::~DeviceRings() = default;
uint64_t DeviceRings::slot_bytes() const {
  unavailable("data plane cuda_ipc");
}
int DeviceRings::device() const {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::copy_in(uint32_t, const void*, size_t, StreamHandle) {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::copy_in_host(uint32_t, const void*, size_t) {
  unavailable("data plane cuda_ipc");
}
StreamHandle DeviceRings::push_stream() const {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::sync_host_pushes() {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::enter_reader_thread() {
  unavailable("data plane cuda_ipc");
}
StreamHandle DeviceRings::reader_stream() const {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::copy_out(uint32_t, void*, size_t) {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::copy_out_to_host(uint32_t, void*, size_t) {
  unavailable("data plane cuda_ipc");
}
void DeviceRings::release(uint32_t) {
  unavailable("data plane cuda_ipc");
}

struct DeviceHold::Impl {};

DeviceHold::DeviceHold(size_t) {
  unavailable("device update buffer");
}
DeviceHold::~DeviceHold() = default;
size_t DeviceHold::bytes() const {
  unavailable("device update buffer");
}
void* DeviceHold::data() const {
  unavailable("device update buffer");
}
void DeviceHold::begin_fill(StreamHandle) {
  unavailable("device update buffer");
}
void DeviceHold::end_fill(StreamHandle) {
  unavailable("device update buffer");
}
void DeviceHold::copy_to_device(void*, StreamHandle) {
  unavailable("device update buffer");
}
void DeviceHold::copy_to_host(void*) {
  unavailable("device update buffer");
}

}  // namespace muon::client
