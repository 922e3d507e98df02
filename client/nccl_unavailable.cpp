// The nccl data plane in a client built without NCCL (no CUDA, or no libnccl/nccl.h next to the
// toolkit): nccl_plane_built() is false, so a Connection refuses data plane nccl before it
// connects, and the maker throws BackendUnavailable should one be reached anyway.
#include "client/plane.hpp"
#include "core/error.hpp"

namespace muon::client {

bool nccl_plane_built() {
  return false;
}

std::unique_ptr<ClientPlane> make_nccl_plane(const transport::NcclIdBytes&,
                                             const transport::NcclIdBytes&, uint64_t,
                                             std::chrono::milliseconds) {
  throw BackendUnavailable(
      "data plane nccl: this client was built without NCCL (rebuild with the CUDA toolkit and "
      "NCCL: libnccl and nccl.h next to the toolkit)");
}

}  // namespace muon::client
