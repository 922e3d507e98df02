// CUDA IPC on one node: a server exports its device rings and result buffers, a client in another
// process maps them once (IpcHandleCache) and copies tiles straight between its own device memory
// and the server's with cudaMemcpyAsync on its own stream (copy engines; NVLink between GPUs
// where present), ordered on the GPU by interprocess events. No host staging. Control messages
// carry the descriptors (transport/cuda_ipc_handle.hpp); the credits of the control plane say
// which slot a side may use when, the events only order the GPU work behind them.
//
// Limits (CUDA's): memory from cudaMalloc only (not stream-ordered pools from cudaMallocAsync, not
// cuMemCreate/VMM memory such as PyTorch's expandable segments: cudaIpcGetMemHandle refuses
// them); a handle cannot be opened in the process that exported it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device_stream.hpp"
#include "transport/cuda_ipc_cache.hpp"
#include "transport/cuda_ipc_handle.hpp"

struct CUevent_st;  // the CUDA runtime's event: cudaEvent_t is `CUevent_st*`

namespace muon::transport {

/// The CUDA opener: cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess (the allocation may
/// live on another GPU of the node) on the current device, cudaIpcCloseMemHandle.
class CudaIpcOpener final : public IpcOpener {
 public:
  /// Throws DeviceError with CUDA's message (e.g. opening a handle of this same process).
  void* open(const IpcHandleBytes& handle) override;
  void close(void* base) noexcept override;
};

/// An IpcHandleCache with the CUDA opener.
std::unique_ptr<IpcHandleCache> make_cuda_ipc_cache();

/// The cudaMalloc allocation that holds a device address.
struct DeviceAllocation {
  void* base = nullptr;  ///< allocation start (what cudaIpcGetMemHandle must be given)
  size_t size = 0;       ///< allocation bytes
  size_t offset = 0;     ///< the address' distance from base
};

/// The allocation containing `ptr`, from the driver (cuMemGetAddressRange, reached through
/// cudaGetDriverEntryPointByVersion so nothing links libcuda). Throws InvalidArgument when `ptr`
/// is not device memory of this process, DeviceError when the driver lacks the entry point.
DeviceAllocation find_allocation(const void* ptr);

/// Exports [ptr, ptr + bytes) of this process' device memory for another process: the handle of
/// the enclosing allocation (cudaIpcGetMemHandle at its base) and the offset of ptr in it.
/// Throws InvalidArgument when the range leaves the allocation or ptr is not device memory;
/// DeviceError when CUDA refuses the export (see the limits above).
ExportedRegion export_region(const void* ptr, size_t bytes);

/// The address in this process of a region another process exported, its allocation mapped
/// through `cache` (once per handle).
void* open_region(const ExportedRegion& region, IpcHandleCache& cache);

/// The per-slot interprocess events of a ring (see DeviceRingDescriptor): `ready` orders the
/// consumer after the producer's write, `free` the producer's next write after the consumer's
/// read. Each call enqueues on `stream` and returns (cudaEventRecord / cudaStreamWaitEvent).
/// Throws InvalidArgument for a slot out of range, DeviceError when CUDA fails.
class SlotEvents {
 public:
  uint64_t slots() const { return ready_.size(); }
  void mark_ready(uint64_t slot, StreamHandle stream) const;
  void wait_ready(uint64_t slot, StreamHandle stream) const;
  void mark_free(uint64_t slot, StreamHandle stream) const;
  void wait_free(uint64_t slot, StreamHandle stream) const;
  /// Whether the GPU has passed the slot's latest ready (free) record, whichever process made it
  /// (cudaEventQuery; never waits; true for an event never recorded). Throws InvalidArgument
  /// for a slot out of range, DeviceError when CUDA fails.
  bool ready_reached(uint64_t slot) const;
  bool free_reached(uint64_t slot) const;

 protected:
  SlotEvents() = default;
  ~SlotEvents() = default;
  void check_slot(uint64_t slot) const;
  void destroy_events() noexcept;
  std::vector<CUevent_st*> ready_, free_;
};

/// The owner's side: a ring of `slots` x `slot_bytes` in one cudaMalloc allocation on the current
/// device, zero-filled, exported at its base with 2 interprocess events per slot
/// (cudaEventInterprocess | cudaEventDisableTiming). Layout: [slot 0][slot 1]...[slot n-1].
class DeviceRing : public SlotEvents {
 public:
  /// Throws InvalidArgument for 0 slots or bytes (or an overflowing product), DeviceError when
  /// an allocation, export or event fails.
  DeviceRing(uint64_t slots, uint64_t slot_bytes);
  ~DeviceRing();
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  /// Device address of slot i in this process.
  void* slot(uint64_t i) const;
  uint64_t slot_bytes() const { return descriptor_.slot_bytes; }
  /// What a peer needs to open the ring (send it with ring_descriptor_to_json).
  const DeviceRingDescriptor& descriptor() const { return descriptor_; }

 private:
  void release() noexcept;
  void* base_ = nullptr;
  DeviceRingDescriptor descriptor_;
};

/// A peer's side of another process' DeviceRing: the memory mapped through `cache` (shared with
/// every other ring and region of that allocation), the events opened (cudaIpcOpenEventHandle)
/// and destroyed with this object. The cache must outlive it.
class RemoteRing : public SlotEvents {
 public:
  /// Throws InvalidArgument for an inconsistent descriptor, DeviceError when CUDA fails.
  RemoteRing(const DeviceRingDescriptor& ring, IpcHandleCache& cache);
  ~RemoteRing();
  RemoteRing(const RemoteRing&) = delete;
  RemoteRing& operator=(const RemoteRing&) = delete;

  /// Device address of slot i in this process.
  void* slot(uint64_t i) const;
  uint64_t slot_bytes() const { return slot_bytes_; }

  /// Producer: on `stream` (e.g. the trainer's), waits until the owner freed the slot, copies
  /// `bytes` from `src` (this process' device memory, or pinned host memory) into slot `slot`
  /// with cudaMemcpyAsync, and records the slot's ready event. Returns without waiting.
  /// Throws InvalidArgument when bytes > slot_bytes or the slot is out of range.
  void copy_in(uint64_t slot, const void* src, size_t bytes, StreamHandle stream) const;

  /// Consumer: on `stream`, waits until the owner marked the slot ready, copies `bytes` of it to
  /// `dst`, and records the slot's free event. Returns without waiting.
  void copy_out(uint64_t slot, void* dst, size_t bytes, StreamHandle stream) const;

 private:
  void* base_ = nullptr;
  uint64_t slot_bytes_ = 0;
};

}  // namespace muon::transport
