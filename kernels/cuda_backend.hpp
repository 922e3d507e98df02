// CUDA backend factory. Compiled only when CUDA is enabled (MUON_HAVE_CUDA); the header stays
// free of CUDA types so that plain C++ translation units can include it.
#pragma once

#include <memory>

#include "kernels/backend.hpp"

namespace muon {

/// Creates the cuBLAS backend on config.cuda_device. Throws BackendUnavailable when no usable
/// GPU is present (no driver, "driver version is insufficient", cublasCreate failing, ...),
/// with the CUDA error text in the message.
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config);

}  // namespace muon
