// The server's half of an nccl data-plane session (nccl_session.hpp), in a build with NCCL.
#include "daemon/nccl_session.hpp"

#include <cuda_runtime_api.h>

#include <atomic>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_convert.hpp"
#include "kernels/device_event.hpp"
#include "transport/cuda_ipc.hpp"
#include "transport/nccl_comm.hpp"

namespace muon::daemon {

// The communicators and the streams their transfers run on (one per direction: a communicator
// is used from one stream at a time). Shared by the rings and the joining thread.
class NcclSession {
 public:
  int device = 0;
  transport::NcclIdBytes tx_id{}, rx_id{};
  std::unique_ptr<DeviceStream> recv_stream, send_stream;
  OwnedEvent sent;      // the last copy into a result slot, for the return stream to wait on
  DeviceBuffer warmup;  // 2 floats for the warm-up transfers (allocated with the session: a
                        // cudaFree on the joining thread would wait for every session's kernels)
  std::atomic<bool> ready{false};
  // Last: destroyed first, so that transfers still queued end before streams and buffers go.
  std::unique_ptr<transport::NcclComm> tx_comm, rx_comm;  // set by the joining thread

  /// The client pushes once its own join and warm-up returned, which can be a moment before the
  /// joining thread here is done; the Session holds its frames (and results) until the join's
  /// outcome reached the io thread (Session::hold_data_plane), so nothing waits here.
  NcclSession& joined() {
    if (!ready) throw InvalidArgument("the session's NCCL communicators are not joined");
    return *this;
  }
};

std::shared_ptr<NcclSession> open_nccl_session(int device) {
  MUON_CUDA_CHECK(cudaSetDevice(device));
  auto n = std::make_shared<NcclSession>();
  n->device = device;
  n->tx_id = transport::new_nccl_id();
  n->rx_id = transport::new_nccl_id();
  n->recv_stream = std::make_unique<DeviceStream>(StreamPriority::normal);
  n->send_stream = std::make_unique<DeviceStream>(StreamPriority::normal);
  n->warmup.reserve(2 * sizeof(float));
  return n;
}

std::pair<transport::NcclIdBytes, transport::NcclIdBytes> nccl_session_ids(const NcclSession& n) {
  return {n.tx_id, n.rx_id};
}

int nccl_session_device(const NcclSession& n) {
  return n.device;
}

void join_nccl_session(NcclSession& n, std::chrono::milliseconds timeout) {
  MUON_CUDA_CHECK(cudaSetDevice(n.device));
  n.tx_comm = std::make_unique<transport::NcclComm>(n.tx_id, 2, 0, timeout);
  n.rx_comm = std::make_unique<transport::NcclComm>(n.rx_id, 2, 0, timeout);
  // Connect both now (the client does the same after its join): a communicator's first transfer
  // sets up the connection and cannot return before the peer made its call; later calls on the
  // io thread then only enqueue.
  const transport::RecvTile in{n.warmup.as<float>(), 1, DType::f32};
  const transport::SendTile out{n.warmup.as<float>() + 1, 1, DType::f32};
  n.tx_comm->recv(1, {&in, 1}, n.recv_stream->get());
  n.rx_comm->send(1, {&out, 1}, n.send_stream->get());
  n.tx_comm->wait(n.recv_stream->get(), timeout);
  n.rx_comm->wait(n.send_stream->get(), timeout);
  n.ready = true;
}

void nccl_receive(NcclSession& session, transport::DeviceRing& tx, uint32_t slot, int64_t count,
                  DType dtype) {
  auto& n = session.joined();
  const auto stream = n.recv_stream->get();
  tx.wait_free(slot, stream);  // the previous chunk of the slot was reduced
  const transport::RecvTile tile{tx.slot(slot), static_cast<size_t>(count), dtype};
  n.tx_comm->recv(1, {&tile, 1}, stream);
  tx.mark_ready(slot, stream);
}

void nccl_stage_update(NcclSession& session, transport::DeviceRing& rx, uint32_t slot,
                       const float* src, int64_t count, DType dtype, StreamHandle ret) {
  auto& n = session.joined();
  const auto stream = n.send_stream->get();
  // After the slot's previous send (this stream). One copy more than sending from `src`
  // directly, so that the send can wait for its frame while the next step may already
  // overwrite the update.
  if (dtype == DType::bf16) {
    narrow_to_bf16_device(src, static_cast<uint16_t*>(rx.slot(slot)), count, stream);
  } else {
    MUON_CUDA_CHECK(cudaMemcpyAsync(rx.slot(slot), src, static_cast<size_t>(count) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
  }
  rx.mark_ready(slot, stream);
  // The next step may overwrite the update once this copy is done (updates_enqueued).
  MUON_CUDA_CHECK(cudaEventRecord(n.sent.e, stream));
  MUON_CUDA_CHECK(cudaStreamWaitEvent(ret, n.sent.e, 0));
}

void nccl_send_slot(NcclSession& session, transport::DeviceRing& rx, uint32_t slot, size_t bytes,
                    DType dtype) {
  auto& n = session.joined();
  const auto stream = n.send_stream->get();
  rx.wait_ready(slot, stream);
  const transport::SendTile tile{rx.slot(slot), bytes / dtype_bytes(dtype), dtype};
  n.rx_comm->send(1, {&tile, 1}, stream);
  rx.mark_free(slot, stream);
}

}  // namespace muon::daemon
