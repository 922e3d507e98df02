// NCCL for the trainer's client library, loaded at the first use of the nccl data plane: the
// library links no libnccl (218 MB in the toolkit), so trainers on the shm or cuda_ipc planes
// never map it. As with the CUDA runtime (cuda_runtime_loader.cpp), a copy already in the
// process wins (PyTorch's nvidia-nccl wheel, found by soname with RTLD_NOLOAD), so torch's
// collectives and ours share one NCCL; otherwise libnccl.so.2 is loaded through the library
// search path, then from the toolkit this library was built against.
//
// ncclConfig_t carries its own size and version (NCCL_CONFIG_INITIALIZER), which is how NCCL
// itself reads a config from a newer header; the entry points used here exist in every NCCL
// since 2.14. A missing library or entry point turns into ncclSystemError, whose message
// (ncclGetErrorString) says why.
#include <nccl.h>

#include <string>

#include "client/runtime_library.hpp"

namespace {

using muon::client::RuntimeLibrary;

const RuntimeLibrary& nccl() {
  static const RuntimeLibrary n =
      muon::client::load_runtime_library({"libnccl.so.2"}, {"libnccl.so.2", MUON_NCCL_PATH});
  return n;
}

template <class Fn>
Fn entry(const char* name) {
  return reinterpret_cast<Fn>(nccl().entry(name));
}

}  // namespace

#define MUON_FORWARD(name, params, args)             \
  extern "C" ncclResult_t name params {              \
    using Fn = ncclResult_t (*) params;              \
    static const Fn fn = entry<Fn>(#name);           \
    return fn ? fn args : ncclSystemError;           \
  }

MUON_FORWARD(ncclGetUniqueId, (ncclUniqueId * id), (id))
MUON_FORWARD(ncclCommInitRankConfig,
             (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config),
             (comm, nranks, id, rank, config))
MUON_FORWARD(ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* error), (comm, error))
MUON_FORWARD(ncclSend,
             (const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
              cudaStream_t stream),
             (buf, count, type, peer, comm, stream))
MUON_FORWARD(ncclRecv,
             (void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
              cudaStream_t stream),
             (buf, count, type, peer, comm, stream))
MUON_FORWARD(ncclGroupStart, (), ())
MUON_FORWARD(ncclGroupEnd, (), ())
MUON_FORWARD(ncclCommAbort, (ncclComm_t comm), (comm))
MUON_FORWARD(ncclCommFinalize, (ncclComm_t comm), (comm))
MUON_FORWARD(ncclCommDestroy, (ncclComm_t comm), (comm))

#undef MUON_FORWARD

extern "C" const char* ncclGetErrorString(ncclResult_t result) {
  using Fn = const char* (*)(ncclResult_t);
  static const Fn fn = entry<Fn>("ncclGetErrorString");
  if (fn) return fn(result);
  static const std::string why = "NCCL could not be loaded (" + nccl().failure + ")";
  return why.c_str();
}
