// Placeholder until the CUDA backend lands: reports "unavailable" so the build links.
#include "core/error.hpp"
#include "kernels/cuda_backend.hpp"

namespace muon {
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig&) {
  throw BackendUnavailable("CUDA backend not implemented yet");
}
}  // namespace muon
