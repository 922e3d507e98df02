// The one place that picks a PeerLink's data plane from what the hello agreed on.
#include "daemon/pool/link_plane.hpp"

#include "core/error.hpp"

namespace muon::daemon {

std::unique_ptr<LinkPlane> make_link_plane(const transport::HelloOk& ok, int device,
                                           std::chrono::milliseconds timeout, LinkPost post) {
  switch (ok.data_plane) {
    case transport::DataPlane::shm:
      return make_shm_link_plane(ok);
    case transport::DataPlane::nccl:
      if (!ok.nccl_tx_id || !ok.nccl_rx_id) {
        throw InvalidArgument("the peer agreed to data plane nccl but sent no NCCL ids");
      }
      return make_nccl_link_plane(ok, device, timeout, std::move(post));
    case transport::DataPlane::cuda_ipc:
      break;
  }
  throw InvalidArgument("data plane cuda_ipc between servers of a pool: a server reaches its "
                        "peers over shm (same host) or nccl");
}

}  // namespace muon::daemon
