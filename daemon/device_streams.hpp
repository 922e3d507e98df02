// The GPU data plane's streams, and what each one carries (daemon/device_plane.hpp). `->` is
// stream order; names are events (a slot's ready/free, a parameter's grad_ready/released, a rank
// buffer's `used`: recorded after every move in or out of it, waited before the next one).
//
//   receive  1/session (io)  slot ready, used -> slot added into its rank's buffer -> used,
//                            slot free
//   shm      1 (io)          host slot -> staging -> its fence (polled before the slot's release);
//                            used -> staging added into its rank's buffer -> used
//   reduce   1 (io)          a step's last commit: every rank's used -> ranks summed in order
//                            into the gradient -> used, grad_ready [-> gradient read-back
//                            (relayed)]; momentum to and from page-locked host blocks (so
//                            before the next grad_ready)
//   compute  1 (worker)      grad_ready, released -> momentum, Newton-Schulz, scale -> update
//   ret      1 (io)          [owner's update from a host block ->] slot free -> update (or
//                            bf16) -> slot ready; [-> update read-back to a host block] ->
//                            released
//   host     1 (io)          waited-for copies: fills, a cuda_ipc momentum load (no other
//                            client's event)
//   staging  1 (io)          slot free -> host chunk -> slot ready (result chunks that waited)
//
// A session's receive stream is its own, so a client that is slow to send (an nccl peer whose
// data is not there yet) delays only its own chunks; the reduction waits for each contributing
// rank's last move, whichever stream made it. Per nccl session, two more (nccl_session.hpp):
// recv_stream (ncclRecv into gradient slots, then their ready) and send_stream (updates into
// result slots, ncclSend; `sent` orders ret after the copy). The copy streams run at the
// device's greatest priority, so that a chunk's reduction or return never queues behind
// Newton-Schulz kernels (the server's or a co-located trainer's); compute takes --stream-priority
// (gpu-review F9); NCCL's streams keep the default (F4). Only for files built with CUDA.
#pragma once

#include "kernels/device_stream.hpp"

namespace muon::daemon {

/// The plane-wide streams (a session's receive stream lives with its rings).
struct DeviceStreams {
  /// On the current device. Throws DeviceError.
  explicit DeviceStreams(StreamPriority compute_priority)
      : shm(StreamPriority::high),
        reduce(StreamPriority::high),
        compute(compute_priority),
        ret(StreamPriority::high),
        host(StreamPriority::high),
        staging(StreamPriority::high) {}

  DeviceStream shm, reduce, compute, ret, host, staging;
};

}  // namespace muon::daemon
