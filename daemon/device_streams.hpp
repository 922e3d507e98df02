// The GPU data plane's plane-wide streams, and what each one carries (daemon/device_plane.hpp):
//
//   receive  (io)      slot ready ─▶ chunk + rank buffer ─▶ slot free; last commit: ranks ─▶
//                      gradient ─▶ grad_ready                     (shm chunks staged here too)
//   compute  (worker)  grad_ready, released ─▶ momentum, Newton-Schulz, scale ─▶ update
//   ret      (io)      slot free ─▶ update (or bf16) ─▶ slot ready; all chunks enqueued ─▶ released
//   host     (io)      blocking copies: momentum, update read-back, fills (waits on no client)
//   staging  (io)      slot free ─▶ host chunk ─▶ slot ready (result chunks that waited)
//
// Per nccl session, two more (daemon/nccl_session.hpp): recv_stream (ncclRecv into gradient
// slots) and send_stream (updates into result slots, ncclSend); `sent` orders ret after them.
// The copy streams run at the device's greatest priority, so that a chunk's reduction or return
// never queues behind Newton-Schulz kernels (the server's or a co-located trainer's); compute
// takes --stream-priority (gpu-review F9); NCCL's streams keep the default (F4). Only for files
// built with CUDA.
#pragma once

#include "kernels/device_stream.hpp"

namespace muon::daemon {

struct DeviceStreams {
  /// On the current device. Throws DeviceError.
  explicit DeviceStreams(StreamPriority compute_priority)
      : receive(StreamPriority::high),
        compute(compute_priority),
        ret(StreamPriority::high),
        host(StreamPriority::high),
        staging(StreamPriority::high) {}

  DeviceStream receive, compute, ret, host, staging;
};

}  // namespace muon::daemon
