// NCCL point-to-point between an offload server and its clients across nodes (and across an
// NVL72 domain): a communicator bootstrapped from an ncclUniqueId that travelled through the
// control plane as bytes (transport/nccl_id.hpp), and grouped ncclSend/ncclRecv of tile lists.
// The communicator is non-blocking (ncclConfig_t::blocking = 0) and every wait has a deadline,
// so a dead peer gives an error instead of a hang (the communicator is then aborted).
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <span>

#include "kernels/device_stream.hpp"
#include "kernels/dtype.hpp"
#include "transport/nccl_id.hpp"

namespace muon::transport {

/// A fresh ncclUniqueId (ncclGetUniqueId: it also names the bootstrap endpoint of this process,
/// so the rank that will be rank 0 creates it). Throws DeviceError when NCCL fails.
NcclIdBytes new_nccl_id();

/// A tile to send: `count` elements of `dtype` in device memory.
struct SendTile {
  const void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
};

/// A tile to receive into.
struct RecvTile {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
};

/// One rank of a communicator on the current device. Not thread-safe.
class NcclComm {
 public:
  /// Joins the communicator of `nranks` ranks named by `id` as `rank`
  /// (ncclCommInitRankConfig, non-blocking) and waits up to `timeout` for all ranks to join.
  /// Throws InvalidArgument for a rank outside [0, nranks), DeviceError when NCCL fails or the
  /// timeout passes (the half-made communicator is aborted).
  NcclComm(const NcclIdBytes& id, int nranks, int rank,
           std::chrono::milliseconds timeout = std::chrono::seconds(60));
  /// Finalizes and destroys the communicator (at most 10 s), or aborts it after an error.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  ncclComm_t get() const { return comm_; }

  /// Enqueues, on `stream` and as one NCCL group, an ncclSend of every tile of `send` to `peer`
  /// and an ncclRecv of every tile of `recv` from `peer`, in list order (the peer posts the
  /// matching lists in the same order; peer may be this rank). Either list may be empty. Returns
  /// once NCCL has enqueued the group; the transfers complete on the stream (see wait()).
  /// Throws InvalidArgument (peer out of range, null tile), DeviceError (NCCL).
  void exchange(int peer, std::span<const SendTile> send, std::span<const RecvTile> recv,
                StreamHandle stream);
  void send(int peer, std::span<const SendTile> tiles, StreamHandle stream) {
    exchange(peer, tiles, {}, stream);
  }
  void recv(int peer, std::span<const RecvTile> tiles, StreamHandle stream) {
    exchange(peer, {}, tiles, stream);
  }

  /// Aborts the communicator (ncclCommAbort): transfers queued or running on it return, it is
  /// unusable afterwards. For a peer that is gone (its process, its node): without it a queued
  /// send or receive would spin on its stream forever. May be called from any thread, also while
  /// another is inside exchange() or wait(); idempotent.
  void abort() noexcept;

  /// Waits until `stream` is idle while watching the communicator for asynchronous errors.
  /// Throws DeviceError naming the error, or the timeout, after aborting the communicator (it is
  /// unusable afterwards).
  void wait(StreamHandle stream, std::chrono::milliseconds timeout);

 private:
  // Polls ncclCommGetAsyncError until it leaves ncclInProgress; aborts and throws on an error or
  // after `timeout`. `what` names the operation in the message.
  void settle(std::chrono::milliseconds timeout, const char* what);
  [[noreturn]] void fail(const std::string& message);

  ncclComm_t comm_ = nullptr;
  int nranks_ = 0;
  int rank_ = 0;
  std::atomic<bool> healthy_{false};
};

}  // namespace muon::transport
