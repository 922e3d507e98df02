// The server's half of one session on the nccl data plane (daemon/device_plane.hpp): two 2-rank
// communicators (tx: gradients from the client, rx: updates to it; transport/nccl_comm.hpp) and
// the two streams their transfers run on, over the session's local rings. Built from
// nccl_session.cpp where NCCL is found, else nccl_session_none.cpp (where no session can be
// opened), so the GPU data plane calls these without asking whether NCCL is there.
//
// Threads: open and the transfers on the io thread; join on the plane's joining thread; the
// last reference may go on the session's teardown thread (the communicators are destroyed
// first, which ends transfers still queued).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "kernels/device_stream.hpp"
#include "kernels/dtype.hpp"
#include "transport/nccl_id.hpp"

namespace muon::transport {
class DeviceRing;
}

namespace muon::daemon {

class NcclSession;

/// A session on `device`: two fresh ncclUniqueIds, streams at the default priority (NCCL
/// documents that communicators whose streams differ in priority may break when used
/// concurrently on one GPU: gpu-review F4, F9), a warm-up buffer. Throws BackendUnavailable in a
/// build without NCCL, DeviceError.
std::shared_ptr<NcclSession> open_nccl_session(int device);
/// The session's (tx, rx) ids, for hello_ok.
std::pair<transport::NcclIdBytes, transport::NcclIdBytes> nccl_session_ids(const NcclSession& n);
/// The CUDA device the session lives on.
int nccl_session_device(const NcclSession& n);
/// Joins both communicators as rank 0 (tx, then rx, as the client does) and connects them with
/// one warm-up transfer each, waiting up to `timeout` for the client; blocks the calling thread
/// (the plane's joining thread). Afterwards the transfers below may be used. Throws the NCCL
/// error or Timeout text as muon::Error (DeviceError).
void join_nccl_session(NcclSession& n, std::chrono::milliseconds timeout);
/// Posts the receive of the client's ncclSend of a gradient chunk (`count` elements of `dtype`)
/// into tx slot `slot`, after the slot's previous chunk was reduced; records the slot's ready
/// event. Throws InvalidArgument before the join finished.
void nccl_receive(NcclSession& n, transport::DeviceRing& tx, uint32_t slot, int64_t count,
                  DType dtype);
/// Copies `count` fp32 elements of the update at `src` (device memory) into rx slot `slot` as
/// `dtype` (bf16: narrowed) on the session's send stream and records the slot's ready event; the
/// next step may overwrite `src` once `ret` passed the copy (ret waits for it). The slot is sent
/// with nccl_send_slot once its update frame is written (gpu-review F1). Throws InvalidArgument
/// before the join finished.
void nccl_stage_update(NcclSession& n, transport::DeviceRing& rx, uint32_t slot, const float* src,
                       int64_t count, DType dtype, StreamHandle ret);
/// Sends the `bytes` of rx slot `slot` (elements of `dtype`, put there once its ready event is
/// recorded) to the client, on the send stream. Throws InvalidArgument before the join finished.
void nccl_send_slot(NcclSession& n, transport::DeviceRing& rx, uint32_t slot, size_t bytes,
                    DType dtype);

}  // namespace muon::daemon
