// make_backend: the one place that knows every backend (CPU; CUDA where built).
#include <memory>
#include <string>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu_backend.hpp"

#ifdef MUON_HAVE_CUDA
#include "kernels/cuda_backend.hpp"
#endif

namespace muon {

bool cuda_backend_built() {
#ifdef MUON_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(std::string_view kind, const BackendConfig& config) {
  if (kind == "cpu") return std::make_unique<CpuBackend>(config);
  if (kind == "cuda" || kind == "auto") {
#ifdef MUON_HAVE_CUDA
    try {
      return make_cuda_backend(config);
    } catch (const BackendUnavailable&) {
      if (kind == "cuda") throw;
      return std::make_unique<CpuBackend>(config);
    }
#else
    if (kind == "cuda") {
      throw BackendUnavailable(
          "the CUDA backend is not in this build (configured with "
          "MUON_OFFLOAD_CUDA=OFF or no nvcc found)");
    }
    return std::make_unique<CpuBackend>(config);
#endif
  }
  throw InvalidArgument("unknown backend '" + std::string(kind) + "' (known: cpu, cuda, auto)");
}

}  // namespace muon
