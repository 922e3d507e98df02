#include "transport/nccl_comm.hpp"

#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace muon::transport {
namespace {

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes);

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::microseconds(100);

ncclDataType_t nccl_type(DType t) {
  return t == DType::bf16 ? ncclBfloat16 : ncclFloat32;
}

int current_device(const NcclCalls& nccl) {
  int device = 0;
  const cudaError_t e = nccl.get_device(&device);
  if (e != cudaSuccess) {
    throw DeviceError(std::string("cudaGetDevice failed: ") + cudaGetErrorString(e));
  }
  return device;
}

}  // namespace

const NcclCalls& real_nccl_calls() {
  static const NcclCalls calls{
      .comm_init_rank_config = ncclCommInitRankConfig,
      .comm_get_async_error = ncclCommGetAsyncError,
      .group_start = ncclGroupStart,
      .group_end = ncclGroupEnd,
      .send = ncclSend,
      .recv = ncclRecv,
      .comm_finalize = ncclCommFinalize,
      .comm_destroy = ncclCommDestroy,
      .comm_abort = ncclCommAbort,
      .error_string = ncclGetErrorString,
      .get_device = cudaGetDevice,
      .stream_query = cudaStreamQuery,
  };
  return calls;
}

std::mutex& nccl_device_mutex(int device) {
  static std::mutex registry;
  static std::map<int, std::mutex> by_device;  // nodes are stable: references stay valid
  std::lock_guard<std::mutex> g(registry);
  return by_device[device];
}

NcclIdBytes new_nccl_id() {
  ncclUniqueId id;
  MUON_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclIdBytes out;
  std::memcpy(out.data(), &id, out.size());
  return out;
}

NcclComm::NcclComm(const NcclIdBytes& id, int nranks, int rank, std::chrono::milliseconds timeout,
                   const NcclCalls& calls)
    : nccl_(calls),
      device_(current_device(calls)),
      device_mutex_(nccl_device_mutex(device_)),
      nranks_(nranks),
      rank_(rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    throw InvalidArgument("NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  Lock lock(device_mutex_);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = nccl_.comm_init_rank_config(&comm, nranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) nccl_.comm_abort(comm);
    throw DeviceError(std::string("ncclCommInitRankConfig failed: ") + nccl_.error_string(r));
  }
  comm_ = comm;
  healthy_ = true;
  settle(lock, timeout, "ncclCommInitRankConfig (waiting for every rank to join)");
}

NcclComm::~NcclComm() {
  Lock lock(device_mutex_);
  if (comm_ == nullptr) return;  // aborted
  if (healthy_) {
    ncclResult_t r = nccl_.comm_finalize(comm_);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (r == ncclSuccess || r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      r = nccl_.comm_get_async_error(comm_, &state);
      if (r != ncclSuccess) break;
      if (state != ncclInProgress) {
        r = state;
        break;
      }
      if (Clock::now() > deadline) {
        r = ncclInProgress;
        break;
      }
      lock.unlock();
      std::this_thread::sleep_for(kPoll);
      lock.lock();
    }
    if (r == ncclSuccess) {
      const ncclResult_t d = nccl_.comm_destroy(comm_);
      comm_ = nullptr;
      if (d != ncclSuccess) {
        detail::report_failed_call("ncclCommDestroy", nccl_.error_string(d), __FILE__, __LINE__);
      }
      return;
    }
    detail::report_failed_call("ncclCommFinalize", nccl_.error_string(r), __FILE__, __LINE__);
  }
  healthy_ = false;
  abort_locked();
}

void NcclComm::require_live(const char* what) const {
  if (comm_ == nullptr || !healthy_) {
    throw DeviceError(std::string(what) + ": the NCCL communicator (rank " +
                      std::to_string(rank_) + " of " + std::to_string(nranks_) +
                      ") was aborted after an earlier error or a lost peer");
  }
}

void NcclComm::fail(const std::string& message) {
  healthy_ = false;
  abort_locked();  // makes pending NCCL kernels return; the communicator is gone
  throw DeviceError(message);
}

void NcclComm::abort_locked() noexcept {
  if (comm_ == nullptr) return;
  const ncclResult_t a = nccl_.comm_abort(comm_);
  comm_ = nullptr;
  if (a != ncclSuccess) {
    detail::report_failed_call("ncclCommAbort", nccl_.error_string(a), __FILE__, __LINE__);
  }
}

void NcclComm::abort() noexcept {
  healthy_ = false;  // first, so that a poll in progress stops at its next slice
  Lock lock(device_mutex_);
  abort_locked();
}

void NcclComm::settle(Lock& lock, std::chrono::milliseconds timeout, const char* what) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    require_live(what);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = nccl_.comm_get_async_error(comm_, &state);
    if (r != ncclSuccess) fail(std::string(what) + ": " + nccl_.error_string(r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(std::string(what) + " failed: " + nccl_.error_string(state));
    if (Clock::now() > deadline) {
      fail(std::string(what) + ": timed out after " + std::to_string(timeout.count()) +
           " ms (rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) + ")");
    }
    lock.unlock();
    std::this_thread::sleep_for(kPoll);
    lock.lock();
  }
}

void NcclComm::exchange(int peer, std::span<const SendTile> send, std::span<const RecvTile> recv,
                        StreamHandle stream) {
  if (peer < 0 || peer >= nranks_) {
    throw InvalidArgument("NCCL peer " + std::to_string(peer) + " of " + std::to_string(nranks_));
  }
  for (const SendTile& t : send) {
    if (t.data == nullptr && t.count > 0) throw InvalidArgument("NCCL send of a null tile");
  }
  for (const RecvTile& t : recv) {
    if (t.data == nullptr && t.count > 0) throw InvalidArgument("NCCL receive into a null tile");
  }
  if (send.empty() && recv.empty()) return;
  const auto s = static_cast<cudaStream_t>(stream);
  Lock lock(device_mutex_);
  require_live("ncclSend/ncclRecv");
  ncclResult_t r = nccl_.group_start();
  if (r != ncclSuccess) fail(std::string("ncclGroupStart failed: ") + nccl_.error_string(r));
  for (const SendTile& t : send) {
    if (r == ncclSuccess) r = nccl_.send(t.data, t.count, nccl_type(t.dtype), peer, comm_, s);
  }
  for (const RecvTile& t : recv) {
    if (r == ncclSuccess) r = nccl_.recv(t.data, t.count, nccl_type(t.dtype), peer, comm_, s);
  }
  const ncclResult_t end = nccl_.group_end();
  if (r != ncclSuccess && r != ncclInProgress) {
    fail("ncclSend/ncclRecv with peer " + std::to_string(peer) +
         " could not be enqueued: " + nccl_.error_string(r));
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    fail(std::string("ncclGroupEnd failed: ") + nccl_.error_string(end));
  }
  // Non-blocking communicator: the group may still be being enqueued; no other NCCL call on it
  // before it settles (the transfers themselves then run on the stream).
  settle(lock, std::chrono::seconds(60), "ncclGroupEnd");
}

void NcclComm::wait(StreamHandle stream, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto s = static_cast<cudaStream_t>(stream);
  for (;;) {
    {
      Lock lock(device_mutex_);
      require_live("waiting for NCCL transfers");
      const cudaError_t q = nccl_.stream_query(s);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        throw DeviceError(std::string("cudaStreamQuery failed: ") + cudaGetErrorString(q));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = nccl_.comm_get_async_error(comm_, &state);
      if (r != ncclSuccess) fail(std::string("ncclCommGetAsyncError: ") + nccl_.error_string(r));
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(std::string("NCCL transfer failed: ") + nccl_.error_string(state));
      }
      if (Clock::now() > deadline) {
        fail("NCCL transfers did not finish within " + std::to_string(timeout.count()) +
             " ms (rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) +
             "; a peer may be gone)");
      }
    }
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace muon::transport
