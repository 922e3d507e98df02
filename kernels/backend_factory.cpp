// make_backend: the one place that knows every backend (CPU; CUDA where built, else its stand-in
// kernels/cuda_backend_none.cpp, which says why there is none).
#include <memory>
#include <string>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu_backend.hpp"
#include "kernels/cuda_backend.hpp"

namespace muon {

std::unique_ptr<Backend> make_backend(std::string_view kind, const BackendConfig& config) {
  if (kind == "cpu") return std::make_unique<CpuBackend>(config);
  if (kind == "cuda" || kind == "auto") {
    try {
      return make_cuda_backend(config);
    } catch (const BackendUnavailable&) {
      if (kind == "cuda") throw;
      return std::make_unique<CpuBackend>(config);
    }
  }
  throw InvalidArgument("unknown backend '" + std::string(kind) + "' (known: cpu, cuda, auto)");
}

}  // namespace muon
