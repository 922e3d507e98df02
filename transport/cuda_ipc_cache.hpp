// Opening a CUDA IPC memory handle is slow (cudaIpcOpenMemHandle maps the whole allocation and
// can take hundreds of milliseconds) and CUDA allows one mapping of a handle per process, so a
// client opens each handle once and keeps the mapping: IpcHandleCache, keyed by the handle's
// bytes. The open/close calls sit behind IpcOpener so that the cache itself is plain C++ and
// tested on the CPU; transport/cuda_ipc.hpp provides the CUDA opener.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/cuda_ipc_handle.hpp"

namespace muon::transport {

/// Maps and unmaps another process' device allocation.
class IpcOpener {
 public:
  virtual ~IpcOpener() = default;
  /// Maps the allocation `handle` names; returns its base address in this process. Throws
  /// (DeviceError for CUDA) when it cannot.
  virtual void* open(const IpcHandleBytes& handle) = 0;
  /// Unmaps a base that open() returned. Must not throw (reports failures itself).
  virtual void close(void* base) noexcept = 0;
};

/// Each handle opened once, closed once: on close(handle), or for every handle still open when
/// the cache is destroyed (latest first). Thread-safe; opens run under the cache's lock, so two
/// threads asking for the same new handle open it once.
class IpcHandleCache {
 public:
  explicit IpcHandleCache(std::unique_ptr<IpcOpener> opener);
  ~IpcHandleCache();
  IpcHandleCache(const IpcHandleCache&) = delete;
  IpcHandleCache& operator=(const IpcHandleCache&) = delete;

  /// The base address of `handle`'s allocation in this process, opening it on first use.
  /// Propagates the opener's exception (nothing is cached then).
  void* open(const IpcHandleBytes& handle);

  /// Unmaps `handle` if it is open (e.g. the owner freed the allocation: a later allocation gets
  /// a new handle). Returns whether it was open.
  bool close(const IpcHandleBytes& handle);

  /// Handles currently open.
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::unique_ptr<IpcOpener> opener_;
  std::map<IpcHandleBytes, void*> open_;
  std::vector<IpcHandleBytes> order_;  // opening order, for closing latest first
};

}  // namespace muon::transport
