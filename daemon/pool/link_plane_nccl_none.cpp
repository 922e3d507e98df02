// A PeerLink's nccl plane in a server built without NCCL: a GPU server reaching a peer on another
// host needs it, so the maker says what is missing.
#include "core/error.hpp"
#include "daemon/pool/link_plane.hpp"

namespace muon::daemon {

std::unique_ptr<LinkPlane> make_nccl_link_plane(const transport::HelloOk&, int,
                                                std::chrono::milliseconds, LinkPost) {
  throw BackendUnavailable("data plane nccl toward a peer server: this server was built without "
                           "NCCL (rebuild with the CUDA toolkit and NCCL next to it)");
}

}  // namespace muon::daemon
