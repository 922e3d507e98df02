// NCCL point-to-point between an offload server and its clients across nodes (and across an
// NVL72 domain): a communicator bootstrapped from an ncclUniqueId that travelled through the
// control plane as bytes (transport/nccl_id.hpp), and grouped ncclSend/ncclRecv of tile lists.
// The communicator is non-blocking (ncclConfig_t::blocking = 0) and every wait has a deadline,
// so a dead peer gives an error instead of a hang (the communicator is then aborted).
//
// Threads (gpu-review F3, F4): NCCL takes one thread at a time per communicator, and calls on
// different communicators of one GPU must not run concurrently either (NCCL's "Thread Safety"
// page). So every NCCL call an NcclComm makes holds the process-wide lock of the communicator's
// device (nccl_device_mutex), a group from ncclGroupStart to ncclGroupEnd included; the waits
// poll with the lock released between polls, so that other communicators of the device progress.
// The communicator handle is read and cleared only under that lock, so abort() from any thread
// never frees it under another thread's call.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>

#include "kernels/device_stream.hpp"
#include "kernels/dtype.hpp"
#include "transport/nccl_id.hpp"

namespace muon::transport {

/// The NCCL (and CUDA runtime) functions an NcclComm calls: the real ones (real_nccl_calls()),
/// or in a test a stand-in that checks how they are called (no GPU needed).
struct NcclCalls {
  ncclResult_t (*comm_init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*comm_finalize)(ncclComm_t);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  const char* (*error_string)(ncclResult_t);
  cudaError_t (*get_device)(int*);
  cudaError_t (*stream_query)(cudaStream_t);
};

/// libnccl's and the CUDA runtime's own functions.
const NcclCalls& real_nccl_calls();

/// The lock every NCCL call on a communicator of CUDA device `device` holds (one per device, for
/// the whole process; the server's and the client's communicators alike).
std::mutex& nccl_device_mutex(int device);

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

/// One rank of a communicator on the current device. exchange() and wait() from one thread at a
/// time (the owner serializes them); abort() from any thread, at any time.
class NcclComm {
 public:
  /// Joins the communicator of `nranks` ranks named by `id` as `rank`
  /// (ncclCommInitRankConfig, non-blocking) and waits up to `timeout` for all ranks to join.
  /// Throws InvalidArgument for a rank outside [0, nranks), DeviceError when NCCL fails or the
  /// timeout passes (the half-made communicator is aborted).
  NcclComm(const NcclIdBytes& id, int nranks, int rank,
           std::chrono::milliseconds timeout = std::chrono::seconds(60),
           const NcclCalls& calls = real_nccl_calls());
  /// Finalizes and destroys the communicator (at most 10 s), or aborts it after an error.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  /// The CUDA device the communicator lives on (current at construction).
  int device() const { return device_; }
  /// True once abort() ran (or an error aborted the communicator).
  bool aborted() const { return !healthy_; }

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
  /// another is inside exchange() or wait() (which then throw DeviceError "aborted" at their next
  /// poll, within about 100 us); idempotent. Waits for the device lock (another communicator's
  /// call in progress).
  void abort() noexcept;

  /// Waits until `stream` is idle while watching the communicator for asynchronous errors.
  /// Throws DeviceError naming the error, or the timeout, after aborting the communicator (it is
  /// unusable afterwards); DeviceError when abort() came first.
  void wait(StreamHandle stream, std::chrono::milliseconds timeout);

 private:
  using Lock = std::unique_lock<std::mutex>;
  // Polls ncclCommGetAsyncError until it leaves ncclInProgress, with `lock` (the device lock)
  // held for each poll and released between polls; aborts and throws on an error or after
  // `timeout`. `what` names the operation in the message. Returns with `lock` held.
  void settle(Lock& lock, std::chrono::milliseconds timeout, const char* what);
  // Throws DeviceError when the communicator was aborted. Under the device lock.
  void require_live(const char* what) const;
  // ncclCommAbort under the device lock (held by the caller); idempotent.
  void abort_locked() noexcept;
  // abort_locked, then throws DeviceError(message). Under the device lock.
  [[noreturn]] void fail(const std::string& message);

  const NcclCalls& nccl_;
  int device_ = 0;
  std::mutex& device_mutex_;
  ncclComm_t comm_ = nullptr;  // under device_mutex_; nullptr once aborted
  int nranks_ = 0;
  int rank_ = 0;
  std::atomic<bool> healthy_{false};  // false once aborted: polls stop at the next slice
};

}  // namespace muon::transport
