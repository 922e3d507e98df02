// The CUDA runtime of the trainer's client library, loaded at its first use (NCCL's cudawrap in
// spirit): libmuon_offload_client.so links no libcudart, so a trainer that never touches a
// device plane loads none, and one that does shares the runtime already in the process.
//
// Which copy wins: a runtime already loaded (PyTorch's own libcudart.so.12 or .13 from its
// nvidia-cuda-runtime wheel, found by soname with RTLD_NOLOAD) is used as it is, so the client's
// streams, events and IPC handles live in the same runtime as torch's; only when none is loaded
// (the client is used before torch initializes CUDA, or without torch) is one loaded: by soname
// through the library search path, then the toolkit's copy this library was built against. Every
// runtime of a process shares the driver's primary contexts, so a stream or event made by one is
// usable by another (cudaStream_t and cudaEvent_t are the driver's CUstream and CUevent).
//
// Each function below has the runtime's own signature and forwards to the loaded one; a runtime
// that cannot be loaded (or lacks an entry point, e.g. cudaStreamGetDevice before CUDA 12.8)
// turns into cudaErrorSharedObjectInitFailed / cudaErrorNotSupported, which the callers report
// like any CUDA failure. The definitions stay inside the library (its version script exports
// only muon_*), so they never interpose on the process's runtime.
#include <cuda_runtime_api.h>

#include <string>

#include "client/cuda_runtime_loader.hpp"
#include "client/runtime_library.hpp"

namespace muon::client {
namespace {

const RuntimeLibrary& runtime() {
  // Already in the process (PyTorch's): the newest major first.
  static const RuntimeLibrary rt = load_runtime_library(
      {"libcudart.so.13", "libcudart.so.12"}, {MUON_CUDART_SONAME, MUON_CUDART_PATH});
  return rt;
}

// The runtime's entry point `name`, resolved once per call site.
template <class Fn>
Fn entry(const char* name) {
  return reinterpret_cast<Fn>(runtime().entry(name));
}

cudaError_t missing(const char* /*name*/) {
  return runtime().handle ? cudaErrorNotSupported : cudaErrorSharedObjectInitFailed;
}

}  // namespace

std::string cuda_runtime_origin() {
  return runtime().origin;
}

std::string cuda_runtime_failure() {
  return runtime().failure;
}

bool cuda_runtime_loaded() {
  return runtime().handle != nullptr;
}

}  // namespace muon::client

using muon::client::entry;
using muon::client::missing;

// One forwarding definition per runtime function the client's code calls.
#define MUON_FORWARD(ret, name, params, args)                        \
  extern "C" ret name params {                                       \
    using Fn = ret(CUDARTAPI*) params;                               \
    static const Fn muon_loaded_fn = entry<Fn>(#name);               \
    if (!muon_loaded_fn) return missing(#name);                      \
    return muon_loaded_fn args;                                      \
  }

MUON_FORWARD(cudaError_t, cudaGetDeviceCount, (int* count), (count))
MUON_FORWARD(cudaError_t, cudaGetDevice, (int* device), (device))
MUON_FORWARD(cudaError_t, cudaSetDevice, (int device), (device))
MUON_FORWARD(cudaError_t, cudaGetLastError, (void), ())
MUON_FORWARD(cudaError_t, cudaDeviceSynchronize, (void), ())
MUON_FORWARD(cudaError_t, cudaDeviceGetStreamPriorityRange, (int* least, int* greatest),
             (least, greatest))
MUON_FORWARD(cudaError_t, cudaMalloc, (void** ptr, size_t size), (ptr, size))
MUON_FORWARD(cudaError_t, cudaFree, (void* ptr), (ptr))
MUON_FORWARD(cudaError_t, cudaMemset, (void* ptr, int value, size_t count), (ptr, value, count))
MUON_FORWARD(cudaError_t, cudaMemcpy,
             (void* dst, const void* src, size_t count, enum cudaMemcpyKind kind),
             (dst, src, count, kind))
MUON_FORWARD(cudaError_t, cudaMemcpyAsync,
             (void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
              cudaStream_t stream),
             (dst, src, count, kind, stream))
MUON_FORWARD(cudaError_t, cudaPointerGetAttributes,
             (struct cudaPointerAttributes * attributes, const void* ptr), (attributes, ptr))
MUON_FORWARD(cudaError_t, cudaStreamCreateWithPriority,
             (cudaStream_t * stream, unsigned int flags, int priority), (stream, flags, priority))
MUON_FORWARD(cudaError_t, cudaStreamDestroy, (cudaStream_t stream), (stream))
MUON_FORWARD(cudaError_t, cudaStreamSynchronize, (cudaStream_t stream), (stream))
MUON_FORWARD(cudaError_t, cudaStreamQuery, (cudaStream_t stream), (stream))
MUON_FORWARD(cudaError_t, cudaStreamGetPriority, (cudaStream_t stream, int* priority),
             (stream, priority))
MUON_FORWARD(cudaError_t, cudaStreamGetDevice, (cudaStream_t stream, int* device),
             (stream, device))
MUON_FORWARD(cudaError_t, cudaStreamWaitEvent,
             (cudaStream_t stream, cudaEvent_t event, unsigned int flags), (stream, event, flags))
MUON_FORWARD(cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t * event, unsigned int flags),
             (event, flags))
MUON_FORWARD(cudaError_t, cudaEventDestroy, (cudaEvent_t event), (event))
MUON_FORWARD(cudaError_t, cudaEventRecord, (cudaEvent_t event, cudaStream_t stream),
             (event, stream))
MUON_FORWARD(cudaError_t, cudaEventSynchronize, (cudaEvent_t event), (event))
MUON_FORWARD(cudaError_t, cudaEventQuery, (cudaEvent_t event), (event))
MUON_FORWARD(cudaError_t, cudaIpcGetMemHandle, (cudaIpcMemHandle_t * handle, void* ptr),
             (handle, ptr))
MUON_FORWARD(cudaError_t, cudaIpcOpenMemHandle,
             (void** ptr, cudaIpcMemHandle_t handle, unsigned int flags), (ptr, handle, flags))
MUON_FORWARD(cudaError_t, cudaIpcCloseMemHandle, (void* ptr), (ptr))
MUON_FORWARD(cudaError_t, cudaIpcGetEventHandle, (cudaIpcEventHandle_t * handle, cudaEvent_t event),
             (handle, event))
MUON_FORWARD(cudaError_t, cudaIpcOpenEventHandle, (cudaEvent_t * event, cudaIpcEventHandle_t handle),
             (event, handle))
MUON_FORWARD(cudaError_t, cudaGetDriverEntryPointByVersion,
             (const char* symbol, void** function, unsigned int version,
              unsigned long long flags, enum cudaDriverEntryPointQueryResult* status),
             (symbol, function, version, flags, status))

#undef MUON_FORWARD

// The error texts: the runtime's own when it is loaded, else why it is not.
extern "C" const char* cudaGetErrorString(cudaError_t error) {
  using Fn = const char*(CUDARTAPI*)(cudaError_t);
  static const Fn fn = entry<Fn>("cudaGetErrorString");
  if (fn) return fn(error);
  static const std::string why =
      "the CUDA runtime could not be loaded (" + muon::client::cuda_runtime_failure() + ")";
  return why.c_str();
}

extern "C" const char* cudaGetErrorName(cudaError_t error) {
  using Fn = const char*(CUDARTAPI*)(cudaError_t);
  static const Fn fn = entry<Fn>("cudaGetErrorName");
  return fn ? fn(error) : "cudaErrorSharedObjectInitFailed";
}
