// CUDA backend: Backend's host-pointer API on top of the device-pointer Newton-Schulz
// (kernels/device_newton_schulz.hpp). Per call (Backend::newton_schulz_batch): copy the batch to
// the device, run DeviceNewtonSchulz on the backend's stream, copy the result and the non-finite
// flag back, wait. Device buffers, the stream and the cuBLAS handle are created once and reused;
// buffers only grow.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/cuda_backend.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_newton_schulz.hpp"
#include "kernels/device_stream.hpp"

namespace muon {
namespace {

// Selects the device before the members below are created.
struct DeviceSelector {
  explicit DeviceSelector(int device) { MUON_CUDA_CHECK(cudaSetDevice(device)); }
};

/// Newton-Schulz with cuBLAS on one GPU. Inputs and outputs are host fp32 (Backend's contract);
/// the batch is computed in Precision::bf16 (default) or fp32 by DeviceNewtonSchulz, so the host
/// API and the device Muon step (kernels/device_muon.hpp) give the same bits. NsAlgorithm::syrk
/// runs as plain GEMMs here (same polynomial, see DeviceNewtonSchulz); gram as the restarted
/// Gram-space iteration. Not thread-safe (one backend per worker thread); any thread may call it.
class CudaBackend final : public Backend {
 public:
  /// Selects config.cuda_device and creates the stream and the cuBLAS handle.
  /// Throws DeviceError when any of that fails (make_cuda_backend turns it into
  /// BackendUnavailable).
  explicit CudaBackend(const BackendConfig& config)
      : device_(config.cuda_device), selector_(device_), stream_(), ns_(false) {}

  ~CudaBackend() override {
    // Finish queued work before members are released in reverse order.
    MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(device_));
    MUON_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_.get()));
  }

  std::string_view name() const override { return "cuda"; }
  Precision default_precision() const override { return Precision::bf16; }
  /// "cuda <device name> sm_<major><minor> cublas <version>".
  std::string machine_key() const override {
    cudaDeviceProp prop{};
    MUON_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    int version = 0;
    MUON_CUBLAS_CHECK(cublasGetProperty(MAJOR_VERSION, &version));
    int minor = 0;
    MUON_CUBLAS_CHECK(cublasGetProperty(MINOR_VERSION, &minor));
    return std::string("cuda ") + prop.name + " sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + " cublas " + std::to_string(version) + "." +
           std::to_string(minor);
  }

 protected:
  void newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                           const std::vector<NsCoefficients>& coefficients,
                           const OrthogonalizeOptions& options) override {
    if (count <= 0 || rows <= 0 || cols <= 0) return;
    MUON_CUDA_CHECK(cudaSetDevice(device_));
    const Precision precision =
        options.precision == Precision::backend_default ? default_precision() : options.precision;
    const cudaStream_t stream = stream_.get();
    const size_t bytes = sizeof(float) * static_cast<size_t>(count * rows * cols);
    input_.reserve(bytes);
    flag_.reserve(sizeof(int));
    int* flag = flag_.as<int>();
    MUON_CUDA_CHECK(cudaMemcpyAsync(input_.get(), x, bytes, cudaMemcpyHostToDevice, stream));
    MUON_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
    ns_.run(input_.as<float>(), count, rows, cols, coefficients, options, precision, stream, flag);
    MUON_CUDA_CHECK(cudaMemcpyAsync(x, input_.get(), bytes, cudaMemcpyDeviceToHost, stream));
    int nonfinite = 0;
    MUON_CUDA_CHECK(cudaMemcpyAsync(&nonfinite, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
    MUON_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (nonfinite != 0) {
      throw DeviceError("CUDA Newton-Schulz produced NaN/Inf from finite input (batch " +
                        std::to_string(count) + " of " + std::to_string(rows) + "x" +
                        std::to_string(cols) + ", " +
                        std::string(precision_name(precision)) + ")");
    }
  }

 private:
  // Declaration order = construction order; destruction runs in reverse: buffers, Newton-Schulz
  // (handle and workspaces), then the stream.
  int device_;
  DeviceSelector selector_;
  DeviceStream stream_;
  DeviceNewtonSchulz ns_;
  DeviceBuffer input_;  // the fp32 batch as copied in and out
  DeviceBuffer flag_;   // non-finite output flag, int
};

}  // namespace

bool cuda_backend_built() {
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config) {
  // Any failure up to a working cuBLAS handle means "no usable GPU here", not a crash: no driver,
  // "CUDA driver version is insufficient for CUDA runtime version", no device, a bad ordinal,
  // cublasCreate failing.
  try {
    int devices = 0;
    MUON_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices == 0) throw BackendUnavailable("no usable CUDA GPU: no CUDA device is visible");
    if (config.cuda_device < 0 || config.cuda_device >= devices) {
      throw BackendUnavailable("no usable CUDA GPU: device " + std::to_string(config.cuda_device) +
                               " requested, " + std::to_string(devices) + " visible");
    }
    return std::make_unique<CudaBackend>(config);
  } catch (const DeviceError& e) {
    throw BackendUnavailable("no usable CUDA GPU: " + e.message());
  }
}

}  // namespace muon
