// The device data plane in a client built without CUDA: every entry point throws
// BackendUnavailable, so that -DMUON_OFFLOAD_CUDA=OFF builds link and say why at run time. (The
// cuda_ipc plane's rings and the device planes' holds are compiled with CUDA only: nothing here
// makes them.)
#include "client/device_copy.hpp"
#include "client/device_scope.hpp"
#include "client/plane.hpp"
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

std::unique_ptr<ClientPlane> make_cuda_ipc_plane(const transport::DeviceRingDescriptor&,
                                                 const transport::DeviceRingDescriptor&) {
  unavailable("data plane cuda_ipc");
}

}  // namespace muon::client
