// One check-macro family for CUDA runtime, cuBLAS and NCCL calls. Each failure throws
// muon::DeviceError whose text names the call, the library's error string and file:line,
// e.g. "cublasGemmEx(...) failed: CUBLAS_STATUS_NOT_SUPPORTED [cuda_backend.cu:120]".
// Include only from translation units compiled with the CUDA toolkit on the include path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "core/error.hpp"

#if __has_include(<cublas_api.h>)
#include <cublas_api.h>
#define MUON_HAVE_CUBLAS_HEADER 1
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define MUON_HAVE_NCCL_HEADER 1
#endif

namespace muon::detail {

inline std::string failed_call(const char* call, const char* what) {
  return std::string(call) + " failed: " + what;
}

/// Writes "muon-offload: <call> failed: <what> [<file>:<line>]" to stderr (the *_NOTHROW macros).
inline void report_failed_call(const char* call, const char* what, const char* file,
                               int line) noexcept {
  const char* slash = file;
  for (const char* p = file; *p != '\0'; ++p) {
    if (*p == '/') slash = p + 1;
  }
  std::fprintf(stderr, "muon-offload: %s failed: %s [%s:%d]\n", call, what, slash, line);
}

}  // namespace muon::detail

/// Throws muon::DeviceError when a CUDA runtime call does not return cudaSuccess.
#define MUON_CUDA_CHECK(call)                                                 \
  do {                                                                        \
    cudaError_t muon_err_ = (call);                                           \
    if (muon_err_ != cudaSuccess) {                                           \
      throw ::muon::DeviceError(                                              \
          ::muon::detail::failed_call(#call, cudaGetErrorString(muon_err_))); \
    }                                                                         \
  } while (0)

/// For destructors and other noexcept paths only, where throwing would terminate the process:
/// reports a failed CUDA runtime call on stderr (same text as MUON_CUDA_CHECK) and goes on.
#define MUON_CUDA_CHECK_NOTHROW(call)                                                    \
  do {                                                                                   \
    cudaError_t muon_err_ = (call);                                                      \
    if (muon_err_ != cudaSuccess) {                                                      \
      ::muon::detail::report_failed_call(#call, cudaGetErrorString(muon_err_), __FILE__, \
                                         __LINE__);                                      \
    }                                                                                    \
  } while (0)

#ifdef MUON_HAVE_CUBLAS_HEADER
/// Throws muon::DeviceError when a cuBLAS/cuBLASLt call does not return CUBLAS_STATUS_SUCCESS.
#define MUON_CUBLAS_CHECK(call)                                                 \
  do {                                                                          \
    cublasStatus_t muon_st_ = (call);                                           \
    if (muon_st_ != CUBLAS_STATUS_SUCCESS) {                                    \
      throw ::muon::DeviceError(                                                \
          ::muon::detail::failed_call(#call, cublasGetStatusString(muon_st_))); \
    }                                                                           \
  } while (0)

/// The cuBLAS counterpart of MUON_CUDA_CHECK_NOTHROW (destructors only).
#define MUON_CUBLAS_CHECK_NOTHROW(call)                                                    \
  do {                                                                                     \
    cublasStatus_t muon_st_ = (call);                                                      \
    if (muon_st_ != CUBLAS_STATUS_SUCCESS) {                                               \
      ::muon::detail::report_failed_call(#call, cublasGetStatusString(muon_st_), __FILE__, \
                                         __LINE__);                                        \
    }                                                                                      \
  } while (0)
#endif

#ifdef MUON_HAVE_NCCL_HEADER
/// Throws muon::DeviceError when an NCCL call returns neither ncclSuccess nor ncclInProgress.
#define MUON_NCCL_CHECK(call)                                                                      \
  do {                                                                                             \
    ncclResult_t muon_nr_ = (call);                                                                \
    if (muon_nr_ != ncclSuccess && muon_nr_ != ncclInProgress) {                                   \
      throw ::muon::DeviceError(::muon::detail::failed_call(#call, ncclGetErrorString(muon_nr_))); \
    }                                                                                              \
  } while (0)
#endif
