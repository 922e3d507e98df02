// The one place that picks the client's data plane from what the hello agreed on.
#include "client/plane.hpp"

#include "client/client_error.hpp"
#include "core/error.hpp"

namespace muon::client {

void require_plane_built(transport::DataPlane kind, const std::string& endpoint) {
  if (kind == transport::DataPlane::nccl && !nccl_plane_built()) {
    throw BackendUnavailable("data plane nccl for muon-offloadd at '" + endpoint +
                             "': this client was built without NCCL");
  }
}

std::unique_ptr<ClientPlane> make_client_plane(const transport::HelloOk& ok,
                                               const std::string& endpoint,
                                               std::chrono::milliseconds op_timeout) {
  switch (ok.data_plane) {
    case transport::DataPlane::cuda_ipc:
      if (!ok.tx_ring || !ok.rx_ring) {
        throw ServerError("muon-offloadd at '" + endpoint +
                              "' agreed to data plane cuda_ipc but sent no device rings",
                          ErrorCode::bad_reply, "", -1, -1);
      }
      return make_cuda_ipc_plane(*ok.tx_ring, *ok.rx_ring);
    case transport::DataPlane::nccl:
      if (!ok.nccl_tx_id || !ok.nccl_rx_id) {
        throw ServerError(
            "muon-offloadd at '" + endpoint + "' agreed to data plane nccl but sent no NCCL ids",
            ErrorCode::bad_reply, "", -1, -1);
      }
      return make_nccl_plane(*ok.nccl_tx_id, *ok.nccl_rx_id, ok.slot_bytes, op_timeout);
    case transport::DataPlane::shm:
      break;
  }
  return make_shm_plane(ok.shm_name, transport::SegmentLayout{ok.tx_slots, ok.rx_slots,
                                                              ok.slot_bytes});
}

}  // namespace muon::client
