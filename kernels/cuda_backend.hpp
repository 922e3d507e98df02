// CUDA backend factory: cuda_backend.cu where CUDA is enabled (MUON_HAVE_CUDA), else
// cuda_backend_none.cpp, whose factory throws BackendUnavailable saying the build has none. The
// header stays free of CUDA types so that plain C++ translation units can include it.
#pragma once

#include <memory>

#include "kernels/backend.hpp"

namespace muon {

/// Creates the cuBLAS backend on config.cuda_device: name() "cuda", default precision bf16
/// (X, A, B stored in bf16, fp32 accumulation; Precision::fp32 runs fp32 without TF32). Inputs
/// and outputs stay host fp32 per Backend's contract; device buffers, one stream and one cuBLAS
/// handle are created once and reused. NsAlgorithm::syrk runs as plain GEMMs on the GPU (same
/// polynomial); gram as the restarted Gram-space iteration. Throws BackendUnavailable when no usable GPU is present (no driver,
/// "driver version is insufficient", no device, a device ordinal out of range, cublasCreate
/// failing, ...) or the build has no CUDA, with the reason in the message; later calls throw
/// DeviceError.
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config);

}  // namespace muon
