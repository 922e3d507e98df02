#include "client/device_rings.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "client/device_wait.hpp"
#include "core/cuda_check.hpp"
#include "transport/cuda_ipc.hpp"

namespace muon::client {

namespace {

// One cache per process: each server allocation is mapped once, whatever the connections. Never
// destroyed: a connection may outlive static destruction (a Python client collected at exit), and
// the process' exit unmaps everything anyway.
transport::IpcHandleCache& ipc_cache() {
  static transport::IpcHandleCache* const cache = transport::make_cuda_ipc_cache().release();
  return *cache;
}

// How many live rings of this process map each allocation: the last one to go unmaps it (the
// cache itself never closes a handle on its own). Leaked like the cache.
struct MappingUsers {
  std::mutex mu;
  std::map<transport::IpcHandleBytes, int> users;
};
MappingUsers& mapping_users() {
  static MappingUsers* const m = new MappingUsers;
  return *m;
}

// One ring's claim on its allocation's mapping, taken before the ring opens it.
class MappingClaim {
 public:
  explicit MappingClaim(const transport::IpcHandleBytes& h) : handle_(h) {
    auto& m = mapping_users();
    std::lock_guard lk(m.mu);
    ++m.users[handle_];
  }
  ~MappingClaim() {
    auto& m = mapping_users();
    std::lock_guard lk(m.mu);  // held while unmapping: a new claim cannot see a stale mapping
    if (--m.users[handle_] == 0) {
      m.users.erase(handle_);
      ipc_cache().close(handle_);
    }
  }
  MappingClaim(const MappingClaim&) = delete;
  MappingClaim& operator=(const MappingClaim&) = delete;

 private:
  transport::IpcHandleBytes handle_;
};

int current_device() {
  int d = 0;
  MUON_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

// A ring's claim and mapping, in destruction order: the ring (its events) before the claim
// (the unmapping).
struct ClaimedRing {
  ClaimedRing(const transport::DeviceRingDescriptor& d)
      : claim(d.memory), ring(std::in_place, d, ipc_cache()) {}
  MappingClaim claim;
  std::optional<transport::RemoteRing> ring;
};

}  // namespace

struct DeviceRings::Impl {
  Impl(const transport::DeviceRingDescriptor& tx_ring,
       const transport::DeviceRingDescriptor& rx_ring)
      : device(current_device()),
        tx(std::make_unique<ClaimedRing>(tx_ring)),
        rx(std::make_unique<ClaimedRing>(rx_ring)) {
    copied_in.assign(tx_ring.slots, nullptr);
    produced.assign(tx_ring.slots, nullptr);
    try {
      for (auto* list : {&copied_in, &produced}) {
        for (auto& e : *list) MUON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
    } catch (...) {
      destroy_events();
      throw;
    }
  }
  ~Impl() {
    MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(device));
    // Nothing may still read or write the mapped memory when it is unmapped. The streams may wait
    // on events of a server that is gone (never recorded; gpu-review F2): past the deadline the
    // mappings stay (leaked until the process exits) rather than go under a pending copy.
    bool idle = stream_idle_within(reader_stream.get(), kTeardownDeadline) &&
                stream_idle_within(push_stream.get(), kTeardownDeadline);
    for (auto e : copied_in) idle = idle && event_done_within(e, kTeardownDeadline);
    destroy_events();
    if (!idle) {
      detail::report_failed_call("DeviceRings teardown",
                                 "copies to or from the server's rings did not finish within "
                                 "10 s; leaving the rings mapped",
                                 __FILE__, __LINE__);
      (void)rx.release();  // leaked on purpose, see above
      (void)tx.release();
      return;
    }
    rx->ring.reset();
    tx->ring.reset();
    // The claims go next (rx, then tx: members in reverse order), unmapping the allocations.
  }
  void destroy_events() noexcept {
    for (auto* list : {&copied_in, &produced}) {
      for (auto& e : *list) {
        if (e) MUON_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
        e = nullptr;
      }
    }
  }
  int device;
  std::unique_ptr<ClaimedRing> tx, rx;
  DeviceStream push_stream;  // every copy into the tx ring (device and host sources)
  DeviceStream reader_stream;
  // Per tx slot: recorded after each copy_in, waited for before unmapping.
  std::vector<cudaEvent_t> copied_in;
  // Per tx slot: the caller's stream at a copy_in, for the push stream to wait on (per slot, so
  // that threads pushing into different slots at once do not share one).
  std::vector<cudaEvent_t> produced;
};

DeviceRings::DeviceRings(const transport::DeviceRingDescriptor& tx,
                         const transport::DeviceRingDescriptor& rx)
    : impl_(std::make_unique<Impl>(tx, rx)) {}

DeviceRings::~DeviceRings() = default;

uint64_t DeviceRings::slot_bytes() const {
  return impl_->tx->ring->slot_bytes();
}

int DeviceRings::device() const {
  return impl_->device;
}

void DeviceRings::copy_in(uint32_t slot, const void* src, size_t bytes, StreamHandle stream) {
  const auto push = impl_->push_stream.get();
  if (stream != push) {  // the source is ready once `stream` passed this point
    cudaEvent_t produced = impl_->produced.at(slot);
    MUON_CUDA_CHECK(cudaEventRecord(produced, static_cast<cudaStream_t>(stream)));
    MUON_CUDA_CHECK(cudaStreamWaitEvent(push, produced, 0));
  }
  impl_->tx->ring->copy_in(slot, src, bytes, push);  // waits the slot's free event there
  MUON_CUDA_CHECK(cudaEventRecord(impl_->copied_in.at(slot), push));
}

void DeviceRings::copy_in_host(uint32_t slot, const void* src, size_t bytes) {
  copy_in(slot, src, bytes, impl_->push_stream.get());
}

void DeviceRings::sync_host_pushes() {
  impl_->push_stream.synchronize();
}

StreamHandle DeviceRings::push_stream() const {
  return impl_->push_stream.get();
}

void DeviceRings::enter_reader_thread() {
  MUON_CUDA_CHECK(cudaSetDevice(impl_->device));
}

StreamHandle DeviceRings::reader_stream() const {
  return impl_->reader_stream.get();
}

void DeviceRings::copy_out(uint32_t slot, void* dst, size_t bytes) {
  impl_->rx->ring->copy_out(slot, dst, bytes, impl_->reader_stream.get());
}

void DeviceRings::copy_out_to_host(uint32_t slot, void* dst, size_t bytes) {
  impl_->rx->ring->copy_out(slot, dst, bytes, impl_->reader_stream.get());
  impl_->reader_stream.synchronize();
}

void DeviceRings::release(uint32_t slot) {
  impl_->rx->ring->mark_free(slot, impl_->reader_stream.get());
}

}  // namespace muon::client
