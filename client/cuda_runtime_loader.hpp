// Which CUDA runtime the client library uses (client/cuda_runtime_loader.cpp loads it at first
// use; the library links none).
#pragma once

#include <string>

namespace muon::client {

/// True once a CUDA runtime is loaded (loads it on the first call).
bool cuda_runtime_loaded();
/// The library that answered: "libcudart.so.12 (already loaded)" (PyTorch's), a soname or the
/// toolkit's path; "" when none could be loaded.
std::string cuda_runtime_origin();
/// Why no runtime could be loaded (each attempt's dlerror); "" when one was.
std::string cuda_runtime_failure();

}  // namespace muon::client
