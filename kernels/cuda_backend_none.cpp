// The CUDA backend in a build without CUDA (cuda_backend.hpp): there is none, and creating it
// says why.
#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cuda_backend.hpp"

namespace muon {

bool cuda_backend_built() {
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig&) {
  throw BackendUnavailable(
      "the CUDA backend is not in this build (configured with MUON_OFFLOAD_CUDA=OFF or no nvcc "
      "found)");
}

}  // namespace muon
