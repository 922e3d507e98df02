#include "transport/nccl_comm.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <thread>
#include <utility>

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

}  // namespace

NcclIdBytes new_nccl_id() {
  ncclUniqueId id;
  MUON_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclIdBytes out;
  std::memcpy(out.data(), &id, out.size());
  return out;
}

NcclComm::NcclComm(const NcclIdBytes& id, int nranks, int rank, std::chrono::milliseconds timeout)
    : nranks_(nranks), rank_(rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    throw InvalidArgument("NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, nranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw DeviceError(std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(r));
  }
  healthy_ = true;
  settle(timeout, "ncclCommInitRankConfig (waiting for every rank to join)");
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  if (healthy_) {
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (r == ncclSuccess || r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) break;
      if (state != ncclInProgress) {
        r = state;
        break;
      }
      if (Clock::now() > deadline) {
        r = ncclInProgress;
        break;
      }
      std::this_thread::sleep_for(kPoll);
    }
    if (r == ncclSuccess) {
      const ncclResult_t d = ncclCommDestroy(comm_);
      if (d != ncclSuccess) {
        detail::report_failed_call("ncclCommDestroy", ncclGetErrorString(d), __FILE__, __LINE__);
      }
      return;
    }
    detail::report_failed_call("ncclCommFinalize", ncclGetErrorString(r), __FILE__, __LINE__);
  }
  const ncclResult_t a = ncclCommAbort(comm_);
  if (a != ncclSuccess) {
    detail::report_failed_call("ncclCommAbort", ncclGetErrorString(a), __FILE__, __LINE__);
  }
}

void NcclComm::fail(const std::string& message) {
  abort();  // makes pending NCCL kernels return; the communicator is gone
  throw DeviceError(message);
}

void NcclComm::abort() noexcept {
  if (!healthy_.exchange(false)) return;
  ncclComm_t comm = std::exchange(comm_, nullptr);
  if (comm == nullptr) return;
  const ncclResult_t a = ncclCommAbort(comm);
  if (a != ncclSuccess) {
    detail::report_failed_call("ncclCommAbort", ncclGetErrorString(a), __FILE__, __LINE__);
  }
}

void NcclComm::settle(std::chrono::milliseconds timeout, const char* what) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(std::string(what) + ": " + ncclGetErrorString(r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(std::string(what) + " failed: " + ncclGetErrorString(state));
    if (Clock::now() > deadline) {
      fail(std::string(what) + ": timed out after " + std::to_string(timeout.count()) +
           " ms (rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) + ")");
    }
    std::this_thread::sleep_for(kPoll);
  }
}

void NcclComm::exchange(int peer, std::span<const SendTile> send, std::span<const RecvTile> recv,
                        StreamHandle stream) {
  if (!healthy_) throw DeviceError("NCCL communicator was aborted after an earlier error");
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
  MUON_NCCL_CHECK(ncclGroupStart());
  try {
    for (const SendTile& t : send) {
      MUON_NCCL_CHECK(ncclSend(t.data, t.count, nccl_type(t.dtype), peer, comm_, stream));
    }
    for (const RecvTile& t : recv) {
      MUON_NCCL_CHECK(ncclRecv(t.data, t.count, nccl_type(t.dtype), peer, comm_, stream));
    }
  } catch (const DeviceError& e) {
    ncclGroupEnd();
    fail("ncclSend/ncclRecv with peer " + std::to_string(peer) +
         " could not be enqueued: " + e.message());
  }
  const ncclResult_t r = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) {
    fail(std::string("ncclGroupEnd failed: ") + ncclGetErrorString(r));
  }
  // Non-blocking communicator: the group may still be being enqueued; no other NCCL call before
  // it settles (the transfers themselves then run on the stream).
  settle(std::chrono::seconds(60), "ncclGroupEnd");
}

void NcclComm::wait(StreamHandle stream, std::chrono::milliseconds timeout) {
  if (!healthy_) throw DeviceError("NCCL communicator was aborted after an earlier error");
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      throw DeviceError(std::string("cudaStreamQuery failed: ") + cudaGetErrorString(q));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r));
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(std::string("NCCL transfer failed: ") + ncclGetErrorString(state));
    }
    if (Clock::now() > deadline) {
      fail("NCCL transfers did not finish within " + std::to_string(timeout.count()) +
           " ms (rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) +
           "; a peer may be gone)");
    }
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace muon::transport
