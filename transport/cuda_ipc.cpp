#include "transport/cuda_ipc.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <limits>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_sync_guard.hpp"

namespace muon::transport {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

template <class Handle>
IpcHandleBytes bytes_of(const Handle& h) {
  IpcHandleBytes out;
  std::memcpy(out.data(), &h, out.size());
  return out;
}

template <class Handle>
Handle handle_of(const IpcHandleBytes& bytes) {
  Handle h;
  std::memcpy(&h, bytes.data(), bytes.size());
  return h;
}

// A driver entry point, as of the CUDA 12.0 ABI where the runtime can be asked for a version
// (cudaGetDriverEntryPointByVersion, CUDA 12.5+), else as the runtime's own driver gives it.
#if CUDART_VERSION >= 12050
void* driver_entry_point(const char* name, cudaDriverEntryPointQueryResult& found) {
  void* p = nullptr;
  MUON_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found));
  return p;
}
#else
void* driver_entry_point(const char* name, cudaDriverEntryPointQueryResult& found) {
  void* p = nullptr;
  MUON_CUDA_CHECK(cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found));
  return p;
}
#endif

// cuMemGetAddressRange (v2) from the driver the runtime already loaded.
using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

GetAddressRange get_address_range() {
  static const GetAddressRange fn = [] {
    cudaDriverEntryPointQueryResult found{};
    void* p = driver_entry_point("cuMemGetAddressRange", found);
    if (found != cudaDriverEntryPointSuccess || p == nullptr) {
      throw DeviceError("the CUDA driver has no cuMemGetAddressRange entry point");
    }
    return reinterpret_cast<GetAddressRange>(p);
  }();
  return fn;
}

cudaEvent_t new_interprocess_event() {
  cudaEvent_t e = nullptr;
  MUON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
  return e;
}

}  // namespace

// ---- opener, allocations, regions -------------------------------------------------------------

void* CudaIpcOpener::open(const IpcHandleBytes& handle) {
  void* base = nullptr;
  MUON_CUDA_CHECK(cudaIpcOpenMemHandle(&base, handle_of<cudaIpcMemHandle_t>(handle),
                                       cudaIpcMemLazyEnablePeerAccess));
  return base;
}

void CudaIpcOpener::close(void* base) noexcept {
  const auto sync = device_sync_scope();  // closing a mapping syncs the device (gpu-review F7)
  MUON_CUDA_CHECK_NOTHROW(cudaIpcCloseMemHandle(base));
}

std::unique_ptr<IpcHandleCache> make_cuda_ipc_cache() {
  return std::make_unique<IpcHandleCache>(std::make_unique<CudaIpcOpener>());
}

DeviceAllocation find_allocation(const void* ptr) {
  const GetAddressRange range = get_address_range();
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult r = range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    throw InvalidArgument("address " + std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                          " is not in a device allocation of this process (cuMemGetAddressRange "
                          "error " +
                          std::to_string(static_cast<int>(r)) + ")");
  }
  DeviceAllocation a;
  a.base = reinterpret_cast<void*>(base);
  a.size = size;
  a.offset = static_cast<size_t>(reinterpret_cast<CUdeviceptr>(ptr) - base);
  return a;
}

ExportedRegion export_region(const void* ptr, size_t bytes) {
  const DeviceAllocation a = find_allocation(ptr);
  if (bytes > a.size - a.offset) {
    throw InvalidArgument("region of " + std::to_string(bytes) + " bytes at offset " +
                          std::to_string(a.offset) + " leaves its allocation of " +
                          std::to_string(a.size) + " bytes");
  }
  cudaIpcMemHandle_t h;
  MUON_CUDA_CHECK(cudaIpcGetMemHandle(&h, a.base));
  return {bytes_of(h), a.offset, bytes};
}

void* open_region(const ExportedRegion& region, IpcHandleCache& cache) {
  return static_cast<char*>(cache.open(region.memory)) + region.offset;
}

// ---- slot events ------------------------------------------------------------------------------

void SlotEvents::check_slot(uint64_t slot) const {
  if (slot >= ready_.size()) {
    throw InvalidArgument("ring slot " + std::to_string(slot) + " of " +
                          std::to_string(ready_.size()));
  }
}

void SlotEvents::mark_ready(uint64_t slot, StreamHandle stream) const {
  check_slot(slot);
  MUON_CUDA_CHECK(cudaEventRecord(ready_[slot], stream));
}

void SlotEvents::wait_ready(uint64_t slot, StreamHandle stream) const {
  check_slot(slot);
  MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_[slot], 0));
}

void SlotEvents::mark_free(uint64_t slot, StreamHandle stream) const {
  check_slot(slot);
  MUON_CUDA_CHECK(cudaEventRecord(free_[slot], stream));
}

void SlotEvents::wait_free(uint64_t slot, StreamHandle stream) const {
  check_slot(slot);
  MUON_CUDA_CHECK(cudaStreamWaitEvent(stream, free_[slot], 0));
}

namespace {

bool reached(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaErrorNotReady) return false;
  MUON_CUDA_CHECK(q);
  return true;
}

}  // namespace

bool SlotEvents::ready_reached(uint64_t slot) const {
  check_slot(slot);
  return reached(ready_[slot]);
}

bool SlotEvents::free_reached(uint64_t slot) const {
  check_slot(slot);
  return reached(free_[slot]);
}

void SlotEvents::destroy_events() noexcept {
  for (auto* list : {&ready_, &free_}) {
    for (cudaEvent_t e : *list) MUON_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    list->clear();
  }
}

// ---- the owner's ring -------------------------------------------------------------------------

DeviceRing::DeviceRing(uint64_t slots, uint64_t slot_bytes) {
  if (slots == 0 || slot_bytes == 0) {
    throw InvalidArgument("device ring needs slots > 0 and slot_bytes > 0");
  }
  if (slot_bytes > std::numeric_limits<size_t>::max() / slots) {
    throw InvalidArgument("device ring of " + std::to_string(slots) + " x " +
                          std::to_string(slot_bytes) + " bytes overflows");
  }
  descriptor_.slots = slots;
  descriptor_.slot_bytes = slot_bytes;
  try {
    const size_t bytes = slots * slot_bytes;
    MUON_CUDA_CHECK(cudaMalloc(&base_, bytes));
    MUON_CUDA_CHECK(cudaMemset(base_, 0, bytes));
    // cudaMemset may return before it ran, on the legacy stream that non-blocking streams (the
    // server's, a peer's) are not ordered after: wait for it.
    MUON_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    cudaIpcMemHandle_t mem;
    MUON_CUDA_CHECK(cudaIpcGetMemHandle(&mem, base_));
    descriptor_.memory = bytes_of(mem);
    for (uint64_t i = 0; i < slots; ++i) {
      for (auto [events, handles] :
           {std::pair{&ready_, &descriptor_.ready}, std::pair{&free_, &descriptor_.free}}) {
        events->push_back(new_interprocess_event());
        cudaIpcEventHandle_t h;
        MUON_CUDA_CHECK(cudaIpcGetEventHandle(&h, events->back()));
        handles->push_back(bytes_of(h));
      }
    }
  } catch (...) {
    release();
    throw;
  }
}

DeviceRing::~DeviceRing() {
  release();
}

void DeviceRing::release() noexcept {
  destroy_events();
  if (base_ != nullptr) {
    // cudaFree waits for this process's queued work on the device, so none of our copies into
    // the ring is cut short. It does not wait for the peer's: a close this side starts (a
    // timeout, a failed data plane, shutdown) can free memory the peer still writes, which the
    // peer sees as an error on its next copy, not as corrupted memory here.
    const auto sync = device_sync_scope();  // not during a graph capture (gpu-review F7)
    MUON_CUDA_CHECK_NOTHROW(cudaFree(base_));
    base_ = nullptr;
  }
}

void* DeviceRing::slot(uint64_t i) const {
  check_slot(i);
  return static_cast<char*>(base_) + i * descriptor_.slot_bytes;
}

// ---- a peer's view ----------------------------------------------------------------------------

RemoteRing::RemoteRing(const DeviceRingDescriptor& ring, IpcHandleCache& cache)
    : slot_bytes_(ring.slot_bytes) {
  if (ring.slots == 0 || ring.slot_bytes == 0 || ring.ready.size() != ring.slots ||
      ring.free.size() != ring.slots) {
    throw InvalidArgument("device ring descriptor: " + std::to_string(ring.slots) + " slots of " +
                          std::to_string(ring.slot_bytes) + " bytes with " +
                          std::to_string(ring.ready.size()) + " ready and " +
                          std::to_string(ring.free.size()) + " free events");
  }
  try {
    for (uint64_t i = 0; i < ring.slots; ++i) {
      cudaEvent_t e = nullptr;
      MUON_CUDA_CHECK(cudaIpcOpenEventHandle(&e, handle_of<cudaIpcEventHandle_t>(ring.ready[i])));
      ready_.push_back(e);
      MUON_CUDA_CHECK(cudaIpcOpenEventHandle(&e, handle_of<cudaIpcEventHandle_t>(ring.free[i])));
      free_.push_back(e);
    }
    base_ = cache.open(ring.memory);
  } catch (...) {
    destroy_events();
    throw;
  }
}

RemoteRing::~RemoteRing() {
  destroy_events();
}

void* RemoteRing::slot(uint64_t i) const {
  check_slot(i);
  return static_cast<char*>(base_) + i * slot_bytes_;
}

void RemoteRing::copy_in(uint64_t slot, const void* src, size_t bytes, StreamHandle stream) const {
  check_slot(slot);
  if (bytes > slot_bytes_) {
    throw InvalidArgument("copy of " + std::to_string(bytes) + " bytes into a ring slot of " +
                          std::to_string(slot_bytes_));
  }
  wait_free(slot, stream);
  MUON_CUDA_CHECK(cudaMemcpyAsync(this->slot(slot), src, bytes, cudaMemcpyDefault, stream));
  mark_ready(slot, stream);
}

void RemoteRing::copy_out(uint64_t slot, void* dst, size_t bytes, StreamHandle stream) const {
  check_slot(slot);
  if (bytes > slot_bytes_) {
    throw InvalidArgument("copy of " + std::to_string(bytes) + " bytes out of a ring slot of " +
                          std::to_string(slot_bytes_));
  }
  wait_ready(slot, stream);
  MUON_CUDA_CHECK(cudaMemcpyAsync(dst, this->slot(slot), bytes, cudaMemcpyDefault, stream));
  mark_free(slot, stream);
}

}  // namespace muon::transport
